"""MQAR training runs one at a time on every core against several at once on one core each (``jobs``).

The cpu recipe's retrieval sections (mqar, aspect, context) train dozens of models of 30K-120K parameters. Such a
model's step is too small to spread over several cores well, so on a 2-core machine two runs of one thread each may
finish sooner than the same runs one after another at two threads. This measures it on the recipe's own MQAR
configurations and task: each configuration trained --steps steps at a fixed learning rate, (a) one at a time with
--cores threads, (b) --cores at a time, each in its own process with one thread. Both are wall-clock on a quiet
machine (nothing else running: the comparison is the use of the cores). Prints the table and writes
benchmarks/results/bench_mqar_jobs.json with the ratio (a) / (b): above 1, jobs are faster.

    python benchmarks/bench_mqar_jobs.py [--recipe cpu] [--configs 4] [--steps 300] [--cores 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, write_json  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="cpu", help="the reproduce recipe whose mqar configurations and task train")
    ap.add_argument("--configs", type=int, default=4, help="its first N configurations")
    ap.add_argument("--steps", type=int, default=300, help="training steps of each run")
    ap.add_argument("--cores", type=int, default=2, help="threads of (a), and runs at once of (b)")
    args = ap.parse_args()
    if args.configs < 1 or args.steps < 10 or args.cores < 2:
        ap.error("give --configs >= 1, --steps >= 10 and --cores >= 2")

    from linlm.experiments.mqar import run_experiment
    from linlm.reproduce.recipes import load_recipe

    s = load_recipe(args.recipe).mqar
    configs = s.configs()[:args.configs]
    kw = {"steps": args.steps, "batch_size": s.batch_size, "lr": 3e-3, "n_layers": s.n_layers,
          "head_dim": s.head_dim, "test_sequences": s.test_sequences}
    rows, seconds = [], {}
    with tempfile.TemporaryDirectory(prefix="linlm-bench-mqar-jobs-") as tmp:
        for mode, threads, jobs in (("one at a time", args.cores, 1), ("at once", 1, args.cores)):
            t0 = time.perf_counter()
            found = run_experiment(configs, s.task, Path(tmp) / mode.replace(" ", "-"), threads=threads, jobs=jobs,
                                   **kw)
            seconds[mode] = time.perf_counter() - t0
            rows.append({"mode": mode, "threads": threads, "jobs": jobs, "runs": len(configs),
                         "seconds": round(seconds[mode], 2),
                         "steps_per_s": round(len(configs) * args.steps / seconds[mode], 2),
                         "accuracy": [round(r["accuracy"], 4) for r in found]})
    ratio = seconds["one at a time"] / seconds["at once"]
    print_table(["mode", "threads", "jobs", "runs", "seconds", "steps/s"],
                [[r["mode"], r["threads"], r["jobs"], r["runs"], r["seconds"], r["steps_per_s"]] for r in rows])
    print(f"speed-up of {args.cores} runs at once over one at a time: {ratio:.2f}x")
    write_json("bench_mqar_jobs", {"meta": meta(), "recipe": args.recipe, "steps": args.steps,
                                   "configs": [c.name() for c in configs], "records": rows,
                                   "speedup": round(ratio, 3)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
