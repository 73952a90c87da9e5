"""Run every benchmark script in this folder, one after another, and print their tables.

    python benchmarks/run_all.py [--only ops scan ...]

Each script writes its own JSON into benchmarks/results/.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


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
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
