"""Where the compiled kernels' threads come from: torch's OpenMP pool (the library's NAME_par entry points, the
default where the compiler has -fopenmp) against threads of their own (Python threads, what a build without OpenMP
uses), at 2 threads.

In a training step a kernel runs right after torch's ops, whose OpenMP worker keeps spinning for a while after each
parallel op; on threads of their own the kernel's items then share the cores with that spinning thread. Timed here:
the S6 scan forward + backward at Mamba's paper-70m layer shape ([1, 2048, 1024], N = 16), alone and right after a
512 x 512 matmul (the matmul's own time subtracted), each runner switched per call in interleaved rounds (medians).
Needs the compiled kernel built with OpenMP.

    python benchmarks/bench_kernel_threads.py [--repeat 15] [--threads 2]

Writes benchmarks/results/bench_kernel_threads.json.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, time_fn, write_json  # noqa: E402

from linlm.ops import kernel_threads  # noqa: E402
from linlm.ops.selective_scan import selective_scan_kernel  # noqa: E402


def scan_case(T: int = 2048, din: int = 1024, N: int = 16):
    g = torch.Generator().manual_seed(0)
    leaves = dict(u=torch.randn(1, T, din, generator=g), dt=torch.rand(1, T, din, generator=g) * 4 - 6,
                  A=-torch.arange(1, N + 1, dtype=torch.float32).repeat(din, 1), B=torch.randn(1, T, N, generator=g),
                  C=torch.randn(1, T, N, generator=g), D=torch.ones(din))
    leaves = {k: v.requires_grad_() for k, v in leaves.items()}

    def run():
        y, _ = selective_scan_kernel(**leaves, dt_softplus=True)
        y.sum().backward()
        for v in leaves.values():
            v.grad = None

    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not kernel_threads.openmp_pool():
        print("the compiled kernel is missing or was built without OpenMP: nothing to compare")
        return 0
    scan = scan_case()
    a, b = torch.randn(512, 512), torch.randn(512, 512)

    def matmul():
        a @ b

    def after_matmul():
        a @ b
        scan()

    runners = {"openmp pool": contextlib.nullcontext, "own threads": kernel_threads.own_threads}
    cases = {"scan alone": scan, "scan after a matmul": after_matmul, "the matmul": matmul}
    times = {(r, c): [] for r in runners for c in cases}
    for i in range(args.repeat + 1):  # the first round warms up
        for r, runner in (list(runners.items()) if i % 2 == 0 else list(runners.items())[::-1]):
            with runner():
                for c, fn in cases.items():
                    t = time_fn(fn, warmup=0, repeat=1)
                    if i:
                        times[(r, c)].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    results = []
    for r in runners:
        alone, after = med[(r, "scan alone")], med[(r, "scan after a matmul")] - med[(r, "the matmul")]
        results.append(dict(runner=r, threads=args.threads, scan_alone_seconds=alone, scan_after_matmul_seconds=after,
                            times={c: times[(r, c)] for c in cases}))
    own, pool = results[1]["scan_after_matmul_seconds"], results[0]["scan_after_matmul_seconds"]
    print_table(["runner", "scan alone ms", "scan after a matmul ms"],
                [[x["runner"], f"{1e3 * x['scan_alone_seconds']:.1f}", f"{1e3 * x['scan_after_matmul_seconds']:.1f}"]
                 for x in results])
    print(f"scan after a matmul, own threads / openmp pool: {own / pool:.2f}x")
    write_json("bench_kernel_threads", dict(meta=meta(), results=results, after_matmul_ratio=own / pool))
    return 0


if __name__ == "__main__":
    from _common import apply_runtime_settings

    apply_runtime_settings()
    sys.exit(main())
