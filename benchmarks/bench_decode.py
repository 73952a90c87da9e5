"""Decoding targets: flat per-token latency and constant state for the linear models, HGRN2
against transformers' Llama, linlm's LLaMA KV-cache decode against transformers', prefill memory at long context,
and the bf16/fp32 decode latency ratio.

Every row comes from ``linlm.infer.profile.profile`` (batch 1, a prompt of n random tokens, then a median over
``--decode-tokens`` decoded tokens), all in this one process, so the ratios compare runs made under the same load.
At the contexts up to ``--interleave-max``, where linlm's LLaMA and transformers' Llama decode within a few percent
of each other, the two are also timed in alternating rounds (one model after the other in the profile lets the
machine's drift over minutes land on one side), and the LLaMA target uses that ratio.

    python benchmarks/bench_decode.py [--preset paper-70m] [--contexts 512,2048,8192,16384,32768] [--threads 2]
                                      [--interleave-max 2048] [--interleave-rounds 7]
                                      [--decode-tokens 16] [--archs tnl,hgrn2,...] [--no-bf16]
                                      [--exported onnx,pt2] [--plot docs/results/bench_decode.png]

Writes benchmarks/results/bench_decode.json and prints the table and the targets (each with its measured value
and whether it held). With --exported, each linlm model's exported step (linlm.infer.export: onnxruntime for onnx)
is timed beside its eager step, and the exported/eager latency ratio is reported per context.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, write_json  # noqa: E402

from linlm.cli_args import comma_list  # noqa: E402
from linlm.devices import native_bf16  # noqa: E402
from linlm.errors import ConfigError  # noqa: E402
from linlm.infer.profile import HF_LLAMA, plot, profile, rows_to_dicts  # noqa: E402
from linlm.models.registry import ARCHITECTURES, arch_names  # noqa: E402


def constant_state_archs() -> list[str]:
    """The registered architectures whose decoding state does not grow with the context: their latency and state
    must stay flat."""
    return [a for a in arch_names() if ARCHITECTURES[a].constant_state]


def bf16_supported() -> bool:
    """bf16 runs natively on this CPU (AVX-512 or AMX); elsewhere torch computes it through a slow fallback that
    would only time that fallback."""
    return native_bf16(torch.device("cpu"))


def interleaved_llama_vs_hf(preset: str, contexts, rounds: int, steps: int) -> dict[int, dict]:
    """linlm's LLaMA and transformers' Llama decoding in alternating rounds from prompts of each context length
    (``steps`` tokens per round, each model continuing from its own state): per context, the medians over rounds of
    each round's median ms/token, and their ratio. The profile above runs one model after the other, so drift of
    the machine over minutes lands on one side; alternating rounds put it on both."""
    import statistics
    import time

    from linlm.infer.profile import build

    device, out = torch.device("cpu"), {}
    for n in contexts:
        ids = torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(n))
        runs = {}
        for arch in ("llama", HF_LLAMA):
            runner, _ = build(arch, preset, n + rounds * steps + 1, device, torch.float32)
            runs[arch] = [runner, runner.prefill(ids)[1], []]
        token = torch.tensor([5])
        for _ in range(rounds):
            for arch, run in runs.items():
                times = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    _, run[1] = run[0].step(token, run[1])
                    times.append(time.perf_counter() - t0)
                run[2].append(statistics.median(times) * 1e3)
        ms = {arch: statistics.median(run[2]) for arch, run in runs.items()}
        out[n] = {"llama_ms": ms["llama"], "hf_ms": ms[HF_LLAMA], "ratio": ms["llama"] / ms[HF_LLAMA],
                  "rounds_ms": {arch: run[2] for arch, run in runs.items()}}
        print(f"interleaved n={n}: llama {ms['llama']:.2f} ms/token, transformers {ms[HF_LLAMA]:.2f} "
              f"({out[n]['ratio']:.3f}x)", flush=True)
        del runs
    return out


def targets(rows, contexts, interleaved=None) -> list[dict]:
    ok = {(r["arch"], r["context"], r["dtype"]): r for r in rows
          if r["error"] is None and r.get("backend", "eager") == "eager"}
    lo, hi = min(contexts), max(contexts)
    out = []

    def add(name, value, target, held):
        out.append({"target": name, "value": value, "goal": target, "held": held})

    for arch in constant_state_archs():
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
        if interleaved and n in interleaved:
            ratio = interleaved[n]["ratio"]
            add(f"llama / transformers Llama decode latency at {n} (interleaved rounds)", round(ratio, 3),
                "<= 1.0", ratio <= 1.0)
            if ours and theirs:
                add(f"llama / transformers Llama decode latency at {n} (one after the other)",
                    round(ours["decode_ms_per_token"] / theirs["decode_ms_per_token"], 3), "report", None)
        elif ours and theirs:
            ratio = ours["decode_ms_per_token"] / theirs["decode_ms_per_token"]
            add(f"llama / transformers Llama decode latency at {n}", round(ratio, 3), "<= 1.0", ratio <= 1.0)
    mem = {a: ok[(a, hi, "float32")] for a in [*arch_names(), HF_LLAMA] if (a, hi, "float32") in ok}
    for arch, r in mem.items():
        add(f"{arch}: prefill memory at {hi} (peak - before, MiB)",
            round((r["peak_memory_bytes"] - r["memory_before_bytes"]) / 2**20, 1), "report", None)
    for r in rows:
        backend = r.get("backend", "eager")
        if backend != "eager" and r["error"] is None and (r["arch"], r["context"], r["dtype"]) in ok:
            eager = ok[(r["arch"], r["context"], r["dtype"])]
            add(f"{r['arch']}: {backend} step / eager step latency at {r['context']}",
                round(r["decode_ms_per_token"] / eager["decode_ms_per_token"], 3), "report", None)
        if backend != "eager":
            continue
        if r["dtype"] == "bfloat16" and r["error"] is None and (r["arch"], r["context"], "float32") in ok:
            fp32 = ok[(r["arch"], r["context"], "float32")]
            add(f"{r['arch']}: bf16 / fp32 decode latency at {r['context']}",
                round(r["decode_ms_per_token"] / fp32["decode_ms_per_token"], 3), "report", None)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="paper-70m")
    p.add_argument("--archs", default=",".join(arch_names()),
                   help="comma-separated architectures (default: every registered one, %(default)s)")
    p.add_argument("--contexts", default="512,2048,8192,16384,32768")
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-bf16", action="store_true")
    p.add_argument("--exported", default="", help="also time the exported step: onnx, pt2 or onnx,pt2")
    p.add_argument("--interleave-max", type=int, default=2048,
                   help="contexts up to this also time linlm's LLaMA and transformers' in alternating rounds "
                        "(their latencies are close there); 0: none")
    p.add_argument("--interleave-rounds", type=int, default=7)
    p.add_argument("--plot", default=None, help="write the fp32 latency and memory plot (linlm.infer.profile.plot)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        archs = comma_list(args.archs, "--archs", empty_ok=True) + [HF_LLAMA]
        contexts = comma_list(args.contexts, "--contexts", item=int, minimum=1, what="positive integers")
        exported = comma_list(args.exported, "--exported", empty_ok=True)
    except ConfigError as e:
        p.error(str(e))

    def show(row):
        prefill = "eager" if row.prefill_tokens_per_s is None else f"{row.prefill_tokens_per_s:.0f} tok/s"
        print(f"{row.arch:>10} {row.backend:>5} {row.dtype:>8} n={row.context:>6}: "
              + (row.error or f"decode {row.decode_ms_per_token:.2f} ms/token, prefill {prefill}, "
                              f"state {row.state_bytes} B"), flush=True)

    fp32 = profile(archs, args.preset, contexts, decode_tokens=args.decode_tokens, on_row=show, exported=exported)
    rows = rows_to_dicts(fp32)
    if not args.no_bf16 and bf16_supported():
        rows += rows_to_dicts(profile(archs, args.preset, [min(contexts)], dtype="bfloat16",
                                      decode_tokens=args.decode_tokens, on_row=show))
    close = [n for n in contexts if n <= args.interleave_max]
    interleaved = (interleaved_llama_vs_hf(args.preset, close, args.interleave_rounds, args.decode_tokens)
                   if close and "llama" in archs else {})
    results = targets(rows, contexts, interleaved)
    print_table(["arch", "step", "dtype", "context", "prefill tok/s", "decode ms/token", "peak MiB", "state bytes"],
                [[r["arch"], r["backend"], r["dtype"], r["context"], r["prefill_tokens_per_s"],
                  r["decode_ms_per_token"],
                  None if r["peak_memory_bytes"] is None else r["peak_memory_bytes"] / 2**20, r["state_bytes"]]
                 for r in rows if r["error"] is None])
    print()
    print_table(["target", "value", "goal", "held"], [[t["target"], t["value"], t["goal"], t["held"]] for t in results])
    path = write_json("bench_decode", {"meta": meta(), "preset": args.preset, "contexts": contexts,
                                       "decode_tokens": args.decode_tokens, "rows": rows,
                                       "interleaved_llama_vs_hf": interleaved, "targets": results})
    print(f"\nwrote {path}")
    if args.plot:
        print(f"wrote {plot(fp32, args.plot, title=f'{args.preset}, cpu, float32, {args.threads} threads')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
