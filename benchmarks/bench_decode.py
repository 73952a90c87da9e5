"""Decoding targets (issue 11, point 5): flat per-token latency and constant state for the linear models, HGRN2
against transformers' Llama, linlm's LLaMA KV-cache decode against transformers', prefill memory at long context,
and the bf16/fp32 decode latency ratio.

Every row comes from ``linlm.infer.profile.profile`` (batch 1, a prompt of n random tokens, then a median over
``--decode-tokens`` decoded tokens), all in this one process, so the ratios compare runs made under the same load.

    python benchmarks/bench_decode.py [--preset paper-70m] [--contexts 512,2048,8192,16384,32768] [--threads 2]
                                      [--decode-tokens 16] [--archs tnl,hgrn2,...] [--no-bf16]

Writes benchmarks/results/bench_decode.json and prints the table and the targets (each with its measured value
and whether it held).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, write_json  # noqa: E402

from linlm.infer.profile import HF_LLAMA, profile, rows_to_dicts  # noqa: E402

LINEAR = ["tnl", "hgrn2", "cosformer2", "mamba", "mossnet"]


def bf16_supported() -> bool:
    try:
        a = torch.randn(64, 64, dtype=torch.bfloat16)
        return bool(torch.isfinite(a @ a).all())
    except RuntimeError:
        return False


def targets(rows, contexts) -> list[dict]:
    ok = {(r["arch"], r["context"], r["dtype"]): r for r in rows if r["error"] is None}
    lo, hi = min(contexts), max(contexts)
    out = []

    def add(name, value, target, held):
        out.append({"target": name, "value": value, "goal": target, "held": held})

    for arch in LINEAR:
        a, b = ok.get((arch, lo, "float32")), ok.get((arch, hi, "float32"))
        if a and b:
            ratio = b["decode_ms_per_token"] / a["decode_ms_per_token"]
            add(f"{arch}: decode latency at {hi} / at {lo}", round(ratio, 3), "<= 1.15", ratio <= 1.15)
            add(f"{arch}: state bytes at {hi} == at {lo}", [a["state_bytes"], b["state_bytes"]], "equal",
                a["state_bytes"] == b["state_bytes"])
    for n, goal in ((512, 1.0), (16384, 3.0)):
        h, l_ = ok.get(("hgrn2", n, "float32")), ok.get((HF_LLAMA, n, "float32"))
        if h and l_:
            ratio = h["decode_tokens_per_s"] / l_["decode_tokens_per_s"]
            add(f"hgrn2 / transformers Llama decode tokens/s at {n}", round(ratio, 3), f">= {goal}", ratio >= goal)
    for n in contexts:
        ours, theirs = ok.get(("llama", n, "float32")), ok.get((HF_LLAMA, n, "float32"))
        if ours and theirs:
            ratio = ours["decode_ms_per_token"] / theirs["decode_ms_per_token"]
            add(f"llama / transformers Llama decode latency at {n}", round(ratio, 3), "<= 1.0", ratio <= 1.0)
    mem = {a: ok[(a, hi, "float32")] for a in [*LINEAR, "llama", HF_LLAMA] if (a, hi, "float32") in ok}
    for arch, r in mem.items():
        add(f"{arch}: prefill memory at {hi} (peak - before, MiB)",
            round((r["peak_memory_bytes"] - r["memory_before_bytes"]) / 2**20, 1), "report", None)
    for r in rows:
        if r["dtype"] == "bfloat16" and r["error"] is None and (r["arch"], r["context"], "float32") in ok:
            fp32 = ok[(r["arch"], r["context"], "float32")]
            add(f"{r['arch']}: bf16 / fp32 decode latency at {r['context']}",
                round(r["decode_ms_per_token"] / fp32["decode_ms_per_token"], 3), "report", None)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="paper-70m")
    p.add_argument("--archs", default=",".join(["llama", *LINEAR]))
    p.add_argument("--contexts", default="512,2048,8192,16384,32768")
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-bf16", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    archs = [a for a in args.archs.split(",") if a] + [HF_LLAMA]
    contexts = [int(n) for n in args.contexts.split(",")]

    def show(row):
        print(f"{row.arch:>10} {row.dtype:>8} n={row.context:>6}: "
              + (row.error or f"decode {row.decode_ms_per_token:.2f} ms/token, prefill {row.prefill_tokens_per_s:.0f} "
                              f"tok/s, state {row.state_bytes} B"), flush=True)

    rows = rows_to_dicts(profile(archs, args.preset, contexts, decode_tokens=args.decode_tokens, on_row=show))
    if not args.no_bf16 and bf16_supported():
        rows += rows_to_dicts(profile(archs, args.preset, [min(contexts)], dtype="bfloat16",
                                      decode_tokens=args.decode_tokens, on_row=show))
    results = targets(rows, contexts)
    print_table(["arch", "dtype", "context", "prefill tok/s", "decode ms/token", "peak MiB", "state bytes"],
                [[r["arch"], r["dtype"], r["context"], r["prefill_tokens_per_s"], r["decode_ms_per_token"],
                  (r["peak_memory_bytes"] or 0) / 2**20, r["state_bytes"]] for r in rows if r["error"] is None])
    print()
    print_table(["target", "value", "goal", "held"], [[t["target"], t["value"], t["goal"], t["held"]] for t in results])
    path = write_json("bench_decode", {"meta": meta(), "preset": args.preset, "contexts": contexts,
                                       "decode_tokens": args.decode_tokens, "rows": rows, "targets": results})
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
