"""Gated linear attention: the chunkwise form against the sequential reference, forward + backward.

For each gate kind (none, [H], [B, T, H], [B, T, H, K]) at B=1, T=2048, H=4, K=V=128 in float32, both forms run
in this process, warmed up, as a median of several runs. Prints a table and writes
benchmarks/results/bench_ops.json. Target: the chunk form at least 5x faster than the reference.

    python benchmarks/bench_ops.py [--seq-len 2048] [--chunk-size 64] [--kinds none head scalar vector] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, time_fn, write_json  # noqa: E402

from linlm.ops.gla import gla_chunk, gla_reference  # noqa: E402

KINDS = ("none", "head", "scalar", "vector")
TARGET_SPEEDUP = 5.0


def make_inputs(kind: str, B: int, T: int, H: int, K: int, V: int, seed: int = 0):
    """Inputs shaped like the models': scaled queries and gates in the ranges the models produce."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=g) * K**-0.5
    k = torch.randn(B, T, H, K, generator=g)
    v = torch.randn(B, T, H, V, generator=g)
    if kind == "none":  # cosFormer2
        log_a = None
    elif kind == "head":  # TNL: log of exp(-slope_h), ALiBi slopes
        log_a = -(2.0 ** (-8.0 * torch.arange(1, H + 1) / H))
    elif kind == "scalar":  # SSD-style expert: dt * A with dt = softplus(.), A < 0
        log_a = -F.softplus(torch.randn(B, T, H, generator=g))
    else:  # HGRN2: log of a sigmoid forget gate per key channel
        log_a = F.logsigmoid(torch.randn(B, T, H, K, generator=g) + 2.0)
    leaves = [q, k, v] + ([log_a] if log_a is not None else [])
    for x in leaves:
        x.requires_grad_(True)
    return q, k, v, log_a, leaves


def fwd_bwd(fn, q, k, v, log_a, leaves, **kw):
    def run():
        for x in leaves:
            x.grad = None
        o, _ = fn(q, k, v, log_a, **kw)
        o.sum().backward()
        return o

    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--repeat", type=int, default=7, help="timed runs of the chunk form")
    ap.add_argument("--ref-repeat", type=int, default=3, help="timed runs of the (slow) reference")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    B, T, H, K = args.batch, args.seq_len, args.heads, args.head_dim
    V = K

    results, rows = [], []
    for kind in args.kinds:
        q, k, v, log_a, leaves = make_inputs(kind, B, T, H, K, V)
        chunk = fwd_bwd(gla_chunk, q, k, v, log_a, leaves, chunk_size=args.chunk_size)
        ref = fwd_bwd(gla_reference, q, k, v, log_a, leaves)

        # Agreement check on the very inputs timed (outputs and the q gradient).
        o_c = chunk()
        dq_c = q.grad.clone()
        o_r = ref()
        dq_r = q.grad.clone()
        err_o = ((o_c - o_r).abs().max() / o_r.abs().max()).item()
        err_dq = ((dq_c - dq_r).abs().max() / dq_r.abs().max()).item()

        t_chunk = time_fn(chunk, warmup=2, repeat=args.repeat)
        t_ref = time_fn(ref, warmup=1, repeat=args.ref_repeat)
        with torch.no_grad():
            t_chunk_fwd = time_fn(lambda: gla_chunk(q, k, v, log_a, chunk_size=args.chunk_size), warmup=2,
                                  repeat=args.repeat)
        speedup = t_ref / t_chunk
        gate_shape = "None" if log_a is None else str(list(log_a.shape))
        rows.append([kind, gate_shape, t_ref * 1e3, t_chunk * 1e3, f"{speedup:.1f}x", t_chunk_fwd * 1e3,
                     f"{max(err_o, err_dq):.1e}"])
        results.append(dict(gate=kind, log_a_shape=gate_shape, reference_ms=t_ref * 1e3, chunk_ms=t_chunk * 1e3,
                            speedup=speedup, chunk_forward_ms=t_chunk_fwd * 1e3, rel_err_output=err_o,
                            rel_err_grad_q=err_dq, meets_target=speedup >= TARGET_SPEEDUP))
        print(f"{kind}: reference {t_ref * 1e3:.0f} ms, chunk {t_chunk * 1e3:.1f} ms, {speedup:.1f}x", flush=True)

    print()
    print_table(["gate", "log_a shape", "reference ms", "chunk ms", "speedup", "chunk fwd ms", "rel err"], rows)
    payload = dict(
        meta=meta(),
        what="gla forward+backward, float32, median wall time",
        shape=dict(B=B, T=T, H=H, K=K, V=V),
        chunk_size=args.chunk_size,
        repeat=dict(chunk=args.repeat, reference=args.ref_repeat),
        target_speedup=TARGET_SPEEDUP,
        results=results,
    )
    path = write_json("bench_ops", payload)
    print(f"\nwrote {path}")
    missed = [r["gate"] for r in results if not r["meets_target"]]
    if missed:
        print(f"below the {TARGET_SPEEDUP:.0f}x target: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    from _common import apply_runtime_settings

    apply_runtime_settings()
    sys.exit(main())
