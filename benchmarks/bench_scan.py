"""Selective scan (Mamba-1 S6): the compiled kernel and the chunked form against the sequential reference, fwd + bwd.

Sizes: Bt = 1, T = 2048, N = 16, Din = 512 and 1024 (Mamba with d_model 256 and 512 at expand 2), float32.
Inputs look like a Mamba layer at init: u, B, C ~ N(0, 1); dt = softplus(.) in about [0.001, 0.1]; A = -(1..N)
per channel (S4D-real). Loss = sum(y) + 0.5 sum(final state), so every gradient is computed.

Both forms run in this one process, warmed up, as the median of --repeat runs; the ratio is reference / chunked.
Wall time is the headline; the process CPU time of the same calls is reported beside it, because on a shared
machine wall time swings with other jobs (run with --threads 1 there: CPU time is then a stable measure).
A chunk-size sweep of the chunked form (Din = 512) follows. Also reported: the largest difference between the two
forms' outputs at the benchmark size.

    python benchmarks/bench_scan.py [--repeat 5] [--din 512 1024] [--threads N]

Writes benchmarks/results/bench_scan.json.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, time_fn, write_json  # noqa: E402

from linlm.ops import kernel_library  # noqa: E402
from linlm.ops.selective_scan import (  # noqa: E402
    selective_scan_chunked,
    selective_scan_kernel,
    selective_scan_reference,
)

T, N, BT = 2048, 16, 1


def make_inputs(Din: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    dt0 = torch.exp(torch.empty(Din).uniform_(math.log(1e-3), math.log(1e-1), generator=g))  # Mamba's dt init
    dt_bias = torch.log(torch.expm1(dt0))  # softplus^-1
    return {
        "u": torch.randn(BT, T, Din, generator=g),
        "dt": torch.nn.functional.softplus(dt_bias + 0.1 * torch.randn(BT, T, Din, generator=g)),
        "A": -torch.arange(1, N + 1, dtype=torch.float32).repeat(Din, 1),
        "B": torch.randn(BT, T, N, generator=g),
        "C": torch.randn(BT, T, N, generator=g),
        "D": torch.ones(Din),
    }


def fwd_bwd(fn, x: dict, **kw):
    leaves = {k: v.clone().requires_grad_(True) for k, v in x.items()}

    def run():
        for v in leaves.values():
            v.grad = None
        y, s = fn(**leaves, **kw)
        (y.sum() + 0.5 * s.sum()).backward()
        return y.detach(), {k: v.grad for k, v in leaves.items()}

    return run


def fwd_only(fn, x: dict, **kw):
    def run():
        with torch.no_grad():
            return fn(**x, **kw)

    return run


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def timed(fn, warmup: int, repeat: int) -> tuple[float, float]:
    """(median wall seconds from _common.time_fn, median process CPU seconds of the same timed calls).

    CPU time is what the process itself used: at 1 thread it barely moves when other jobs share the machine,
    where wall time can swing several-fold.
    """
    cpu = []

    def run():
        t0 = time.process_time()
        fn()
        cpu.append(time.process_time() - t0)

    wall = time_fn(run, warmup=warmup, repeat=repeat)
    return wall, statistics.median(cpu[warmup:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--din", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--sweep", type=int, nargs="*", default=[16, 32, 64, 128], help="chunk sizes to sweep at Din 512")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()

    rows, results = [], []
    for Din in args.din:
        x = make_inputs(Din)
        ref_fb, chk_fb = fwd_bwd(selective_scan_reference, x), fwd_bwd(selective_scan_chunked, x)
        (y_r, g_r), (y_c, g_c) = ref_fb(), chk_fb()
        diffs = {"y": max_rel_diff(y_c, y_r), **{f"d{k}": max_rel_diff(g_c[k], g_r[k]) for k in g_r}}
        t_ref_f, c_ref_f = timed(fwd_only(selective_scan_reference, x), warmup=1, repeat=args.repeat)
        t_chk_f, c_chk_f = timed(fwd_only(selective_scan_chunked, x), warmup=2, repeat=args.repeat)
        t_ref, c_ref = timed(ref_fb, warmup=1, repeat=args.repeat)
        t_chk, c_chk = timed(chk_fb, warmup=2, repeat=args.repeat)
        kernel = {}
        if kernel_library.available():
            ker_fb = fwd_bwd(selective_scan_kernel, x)
            y_k, g_k = ker_fb()
            t_ker_f, c_ker_f = timed(fwd_only(selective_scan_kernel, x), warmup=2, repeat=args.repeat)
            t_ker, c_ker = timed(ker_fb, warmup=2, repeat=args.repeat)
            kernel = {"kernel_fwd_s": t_ker_f, "kernel_fwd_bwd_s": t_ker, "kernel_cpu_s": {"fwd": c_ker_f,
                      "fwd_bwd": c_ker}, "kernel_vs_chunked_fwd_bwd_cpu_time": c_chk / c_ker,
                      "kernel_max_rel_diff_vs_reference": {"y": max_rel_diff(y_k, y_r),
                                                           **{f"d{k}": max_rel_diff(g_k[k], g_r[k]) for k in g_r}}}
        results.append({"Bt": BT, "T": T, "Din": Din, "N": N, "dtype": "float32", "chunk_size": 64, **kernel,
                        "reference_fwd_s": t_ref_f, "chunked_fwd_s": t_chk_f,
                        "reference_fwd_bwd_s": t_ref, "chunked_fwd_bwd_s": t_chk,
                        "speedup_fwd": t_ref_f / t_chk_f, "speedup_fwd_bwd": t_ref / t_chk,
                        "cpu_s": {"reference_fwd": c_ref_f, "chunked_fwd": c_chk_f,
                                  "reference_fwd_bwd": c_ref, "chunked_fwd_bwd": c_chk},
                        "speedup_fwd_bwd_cpu_time": c_ref / c_chk,
                        "max_rel_diff_vs_reference": diffs})
        shape = f"1x{T}x{Din}, N={N}"
        rows.append([shape, "reference", f"{t_ref_f * 1e3:.0f}", f"{t_ref * 1e3:.0f}", f"{c_ref * 1e3:.0f}", "1.0x"])
        rows.append([shape, "chunked (C=64)", f"{t_chk_f * 1e3:.1f}", f"{t_chk * 1e3:.1f}", f"{c_chk * 1e3:.1f}",
                     f"{t_ref / t_chk:.1f}x (CPU time {c_ref / c_chk:.1f}x; fwd {t_ref_f / t_chk_f:.1f}x)"])
        if kernel:
            rows.append([shape, "kernel", f"{t_ker_f * 1e3:.1f}", f"{t_ker * 1e3:.1f}", f"{c_ker * 1e3:.1f}",
                         f"{t_ref / t_ker:.1f}x (CPU time {c_ref / c_ker:.1f}x; {c_chk / c_ker:.1f}x the chunked)"])
    print_table(["size (Bt x T x Din)", "form", "fwd ms", "fwd+bwd ms", "fwd+bwd CPU ms", "speedup fwd+bwd"],
                rows)
    print("largest relative difference chunked vs reference (float32):",
          {r["Din"]: f"{max(r['max_rel_diff_vs_reference'].values()):.1e}" for r in results})

    sweep = []
    if args.sweep:
        x = make_inputs(512)
        for c in args.sweep:
            t, cpu = timed(fwd_bwd(selective_scan_chunked, x, chunk_size=c), warmup=2, repeat=args.repeat)
            sweep.append({"chunk_size": c, "Din": 512, "fwd_bwd_s": t, "fwd_bwd_cpu_s": cpu})
        print()
        print_table(["chunk_size (Din 512)", "fwd+bwd ms", "fwd+bwd CPU ms"],
                    [[r["chunk_size"], f"{r['fwd_bwd_s'] * 1e3:.1f}", f"{r['fwd_bwd_cpu_s'] * 1e3:.1f}"]
                     for r in sweep])

    payload = {"meta": meta(), "benchmark": "selective_scan", "results": results, "chunk_sweep": sweep,
               "repeat": args.repeat, "load_average_before": load_before, "load_average_after": os.getloadavg(),
               "note": "median of --repeat runs after warm-up, both forms in one process; the machine may be shared "
                       "with other jobs, see the load averages"}
    path = write_json("bench_scan", payload)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    from _common import apply_runtime_settings

    apply_runtime_settings()
    sys.exit(main())
