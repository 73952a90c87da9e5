"""The matrix-vector products of a decoding step (linlm.ops.gemv_kernel) read from memory, at 1 to 8 input rows,
and the int8 kernel at more rows against fbgemm's GEMM.

    python benchmarks/bench_gemv.py [--threads 1] [--rounds 9] [--mib 256] [--q8-rows 16,32,64]

A decoding step reads every weight once, so what matters is the rate at which the products read weights that are
not in any cache. Here the weights are several matrices, --mib in all (well past the last-level cache), used in
turn; each round times one call on each of them. For each count of input rows (1 to GEMV_MAX_ROWS):

- linlm's float32 kernel (``small_linear``: up to 4 rows it reads the weights in their memory order, more rows
  eight weight rows side by side) against torch's ``F.linear`` on the same weights;
- linlm's int8 kernel (``q8_linear``, per-row scales; its instructions are named: AVX-512 VNNI, AVX2 or portable C)
  on int8 copies of the same shapes, against torch's ``F.linear`` on the float32 weights (what int8 replaces).

Both are reported as ms per call and as GB/s of weights read, beside the memory's read rate measured in the same
run (the fastest of 5 sums over a 1 GiB float32 tensor). Then, at the larger row counts of --q8-rows (batched
decoding steps, an int8 prefill's pieces; at most Q8_MAX_ROWS): linlm's int8 kernel against fbgemm's dynamic int8
GEMM (``torch.ops.quantized.linear_dynamic``), the alternative that needs a packed copy of each weight (its packing
timed apart, once per matrix, and not in the calls). Medians over interleaved rounds; at 1 thread on the process's
CPU clock, else the wall clock. Writes benchmarks/results/bench_gemv.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Optional

import torch
import torch.nn.functional as F

from _common import apply_runtime_settings, bandwidth, meta, print_table, write_json

from linlm.ops import gemv_kernel
from linlm.ops.gemv_kernel import (GEMV_MAX_ROWS, Q8_MAX_ROWS, q8_linear, q8_linear_takes, small_linear,
                                   small_linear_takes)

SHAPE = (16384, 1024)  # one weight matrix [N, K]: 64 MiB in float32, 16 MiB in int8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--mib", type=int, default=256, help="float32 weights in all, in MiB (each kind of weight)")
    ap.add_argument("--q8-rows", default="16,32,64",
                    help=f"int8 kernel against fbgemm at these rows (each at most {Q8_MAX_ROWS})")
    args = ap.parse_args()
    q8_rows = [int(r) for r in args.q8_rows.split(",") if r]
    if any(not 0 < r <= Q8_MAX_ROWS for r in q8_rows):
        raise SystemExit(f"--q8-rows: each count must lie in [1, {Q8_MAX_ROWS}], the int8 kernel's rows; "
                         f"got {args.q8_rows}")
    apply_runtime_settings()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    N, K = SHAPE
    count = max(1, args.mib * 2**20 // (N * K * 4))
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(N, K, generator=gen) for _ in range(count)]
    # int8 weights of the same shapes, as many bytes in all as the float32 ones (four times the matrices)
    q8 = [(torch.randint(-127, 128, (N, K), generator=gen, dtype=torch.int8), torch.rand(N, generator=gen) / 100)
          for _ in range(4 * count)]
    read = bandwidth(args.threads)["gb_per_s_cpu" if args.threads == 1 else "gb_per_s_wall"]
    rows_out = []
    with torch.no_grad():
        for rows in range(1, GEMV_MAX_ROWS + 1):
            x = torch.randn(rows, K, generator=gen)
            if not (small_linear_takes(x, weights[0], None) and q8_linear_takes(x, *q8[0], None)):
                raise SystemExit("linlm's decoding kernels are not available here (LINLM_SCAN_BACKEND=torch, or no "
                                 "C compiler): nothing to measure")
            seconds = interleaved({"linlm fp32": lambda: [small_linear(x, w) for w in weights],
                                   "torch fp32": lambda: [F.linear(x, w) for w in weights],
                                   "linlm int8": lambda: [q8_linear(x, q, s) for q, s in q8]}, args.rounds, clock)
            row = {"rows": rows}
            for name, s in seconds.items():
                matrices, nbytes = (4 * count, 4 * count * N * K) if "int8" in name else (count, count * N * K * 4)
                row[f"{name} ms"] = 1e3 * s / matrices
                row[f"{name} GB/s"] = nbytes / s / 1e9
            row["linlm fp32 / torch"] = row["torch fp32 ms"] / row["linlm fp32 ms"]
            rows_out.append(row)
        pack_ms, batched = int8_against_fbgemm(q8, q8_rows, args.rounds, clock, gen) if q8_rows else (None, [])
    form = gemv_kernel.q8_form()
    headers = list(rows_out[0])
    print(f"weights [{N}, {K}]: {count} float32 matrices ({count * N * K * 4 / 2**20:.0f} MiB) and {4 * count} int8 "
          f"ones; int8 sums: {form}; memory read rate {read:.1f} GB/s; {args.threads} thread(s), "
          f"{'CPU' if args.threads == 1 else 'wall'} clock; ms per matrix")
    print_table(headers, [[r[h] for h in headers] for r in rows_out])
    if batched:
        print(f"\nint8 at more rows: linlm's kernel (no copy of the weights) against fbgemm's GEMM on its packed copy "
              f"(packing: {pack_ms:.2f} ms per matrix, once); ms per matrix")
        headers = list(batched[0])
        print_table(headers, [[r[h] for h in headers] for r in batched])
    payload = {"meta": meta(), "shape": [N, K], "float32_matrices": count, "int8_form": form, "threads": args.threads,
               "rounds": args.rounds, "read_gb_per_s": read, "results": rows_out, "int8_batched": batched,
               "fbgemm_pack_ms": pack_ms}
    print(f"wrote {write_json('bench_gemv', payload)}")


def interleaved(variants: dict, rounds: int, clock) -> dict[str, float]:
    """Median seconds of each of ``variants`` (name: a call), one call of each per round, after one warm-up each."""
    for fn in variants.values():
        fn()
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def int8_against_fbgemm(q8, row_counts, rounds, clock, gen) -> tuple[Optional[float], list[dict]]:
    """(ms to pack one matrix for fbgemm, once; a row per row count): linlm's int8 kernel against fbgemm's dynamic
    GEMM on the packed copies, made before the timing."""
    from linlm.models.quant import _pack, kernels_available

    if not kernels_available():
        print("fbgemm's int8 kernels are not in this torch build: the int8 table at more rows is left out")
        return None, []
    t0 = clock()
    packed = [_pack(q, s) for q, s in q8]
    pack_ms = 1e3 * (clock() - t0) / len(q8)
    K = q8[0][0].shape[1]
    out = []
    for rows in row_counts:
        x = torch.randn(rows, K, generator=gen)
        seconds = interleaved({"linlm int8": lambda: [q8_linear(x, q, s) for q, s in q8],
                               "fbgemm int8": lambda: [torch.ops.quantized.linear_dynamic(x, p, True) for p in packed]},
                              rounds, clock)
        row = {"rows": rows, **{f"{name} ms": 1e3 * s / len(q8) for name, s in seconds.items()}}
        row["linlm / fbgemm time"] = row["linlm int8 ms"] / row["fbgemm int8 ms"]
        out.append(row)
    return pack_ms, out


if __name__ == "__main__":
    main()
