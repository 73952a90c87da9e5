"""Run every benchmark script in this folder, one after another, print their tables, then render their pages.

    python benchmarks/run_all.py [--only ops scan ...]

Each script writes its own JSON into benchmarks/results/; at the end render_results.py writes one Markdown page per
JSON file beside it (benchmarks/results/X.md, and index.md). To publish a run, copy its JSON into docs/results/ and
run `python benchmarks/render_results.py`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None, help="names without the bench_ prefix, e.g. ops train_step")
    args = ap.parse_args()
    scripts = sorted(HERE.glob("bench_*.py"))
    if args.only:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in args.only]
    failed = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        t0 = time.time()
        rc = subprocess.call([sys.executable, str(script)])
        print(f"--- {script.name}: exit {rc} in {time.time() - t0:.0f} s", flush=True)
        if rc:
            failed.append(script.name)
    if RESULTS.is_dir():
        sys.path.insert(0, str(HERE))
        from render_results import render_folder

        try:
            render_folder(RESULTS)
            print(f"\npages: {RESULTS / 'index.md'}", flush=True)
        except (OSError, ValueError, KeyError, TypeError) as e:  # a results file this renderer cannot read
            print(f"render_results: {type(e).__name__}: {e}", flush=True)
            failed.append("render_results.py")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
