"""Training-step throughput: tokens/s of forward + backward + AdamW at the paper-70m shape.

Every architecture, our LLaMA and transformers' LlamaForCausalLM of the same config run in one process,
warmed up, median of several steps. Reports ratios against our LLaMA (and ours against HF), and
model-FLOPs utilisation against a matmul measured in the same run.

    python benchmarks/bench_train_step.py [--seq-lens 2048 8192] [--archs ...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, time_fn, write_json  # noqa: E402

from linlm import create_model  # noqa: E402
from linlm.models.counting import count  # noqa: E402
from linlm.models.registry import ARCHITECTURES  # noqa: E402


def matmul_flops_per_s(n: int = 2048, dtype=torch.float32) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    t = time_fn(lambda: a @ b, warmup=2, repeat=5)
    return 2 * n**3 / t


def make_step(model, ids, hf: bool = False):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    targets = ids.roll(-1, dims=1)

    def step():
        logits = model(ids).logits if hf else model(ids, return_aux=True).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--archs", nargs="+", default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' LlamaForCausalLM")
    args = ap.parse_args(argv)
    archs = args.archs or list(ARCHITECTURES)
    peak = matmul_flops_per_s()
    results = []
    for n in args.seq_lens:
        entries = [(a, False) for a in archs]
        if not args.no_hf and "llama" in archs:
            entries.append(("llama", True))
        # Build every model first, then time them in interleaved rounds, so that drift in the machine's
        # load (or first-touch memory costs) does not favour whichever model happens to run first.
        runs = []
        for arch, hf in entries:
            torch.manual_seed(0)
            model = create_model(arch, preset="paper-70m", vocab_size=args.vocab, max_seq_len=max(n, 8192))
            cfg = model.config
            name = arch
            if hf:
                from linlm.hf.llama import to_hf_llama

                model = to_hf_llama(model)
                model.config._attn_implementation = "sdpa"
                name = "llama (transformers)"
            model.train()
            ids = torch.randint(0, args.vocab, (args.batch, n))
            runs.append((name, cfg, make_step(model, ids, hf=hf)))
        times = {name: [] for name, _, _ in runs}
        for _ in range(args.warmup):
            for name, _, step in runs:
                step()
        for _ in range(args.repeat):
            for name, _, step in runs:
                times[name].append(time_fn(step, warmup=0, repeat=1))
        for name, cfg, _ in runs:
            seconds = statistics.median(times[name])
            tokens = args.batch * n
            c = count(cfg, batch=args.batch, seq_len=n)
            flops = (c["flops_per_token"] + c["lm_head_flops_per_token"]) * tokens
            results.append(dict(arch=name, seq_len=n, batch=args.batch, seconds_per_step=seconds,
                                step_seconds=times[name], tokens_per_s=tokens / seconds,
                                model_flops_per_step=flops, mfu=flops / seconds / peak))
            print(f"  {name:>22} n={n}: {tokens / seconds:8.1f} tok/s", flush=True)
        del runs
    for r in results:
        base = next(x for x in results if x["arch"] == "llama" and x["seq_len"] == r["seq_len"])
        r["ratio_vs_our_llama"] = r["tokens_per_s"] / base["tokens_per_s"]
        hf_row = next((x for x in results if x["arch"] == "llama (transformers)" and x["seq_len"] == r["seq_len"]), None)
        if r["arch"] == "llama" and hf_row:
            r["ratio_vs_hf_llama"] = r["tokens_per_s"] / hf_row["tokens_per_s"]
    rows = [[r["arch"], r["seq_len"], f"{r['tokens_per_s']:.0f}", f"{r['ratio_vs_our_llama']:.2f}x",
             f"{r.get('ratio_vs_hf_llama', float('nan')):.2f}x" if "ratio_vs_hf_llama" in r else "",
             f"{100 * r['mfu']:.1f}%"] for r in results]
    print_table(["arch", "seq", "tokens/s", "vs our llama", "vs HF llama", "MFU"], rows)
    print(f"matmul ceiling measured in this run: {peak / 1e9:.0f} GFLOP/s (fp32, n=2048)")
    write_json("bench_train_step", dict(meta=meta(), matmul_flops_per_s=peak, vocab=args.vocab, results=results,
                                        targets={"our_llama_vs_hf": 1.0, "linear_vs_llama_2048": 1.0,
                                                 "linear_vs_llama_8192": 1.4}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
