"""Training-step throughput: tokens/s of forward + backward + AdamW at the paper-70m shape.

One process, two phases per sequence length, each timed in interleaved rounds after a warm-up (medians):
"archs" runs every architecture and reports its ratio to our LLaMA; "hf" then runs our LLaMA against
transformers' LlamaForCausalLM of the same config (converted weights), on their own. Model-FLOPs utilisation is
against a square matmul measured in the same run.

Each library's step is its training path: ours calls ``model(ids, targets=...)`` (the chunked fused head and
cross-entropy that linlm's trainer uses); transformers' model returns logits and the loss is
``F.cross_entropy(logits, targets)`` (its ``labels=`` path does the same plus a shifted copy of the logits, so
this is its faster form). The row "llama (logits + CE)" is our LLaMA through that same logits path, to show how
much of the difference is the loss.

    python benchmarks/bench_train_step.py [--seq-lens 2048 8192] [--archs ...] [--repeat 5] [--no-hf]
"""

from __future__ import annotations

import argparse
import gc
import resource
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
    """The fastest of several square matmuls: the ceiling MFU is measured against (a slow outlier would inflate MFU)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    t = min(time_fn(lambda: a @ b, warmup=1 if i else 2, repeat=1) for i in range(7))
    return 2 * n**3 / t


def make_step(model, ids, mode: str = "fused"):
    """mode: "fused" (ours, targets=), "logits" (ours, logits then F.cross_entropy) or "hf" (transformers)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    targets = ids.roll(-1, dims=1)

    def step():
        if mode == "fused":
            out = model(ids, targets=targets, return_aux=True)
            loss = out.loss + out.aux_loss
        else:
            out = model(ids) if mode == "hf" else model(ids, return_aux=True)
            loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), targets.flatten())
            if mode == "logits":
                loss = loss + out.aux_loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def build(arch: str, mode: str, n: int, args):
    torch.manual_seed(0)
    model = create_model(arch, preset="paper-70m", vocab_size=args.vocab, max_seq_len=max(n, 8192))
    cfg = model.config
    name = {"fused": arch, "logits": f"{arch} (logits + CE)", "hf": f"{arch} (transformers)"}[mode]
    if mode == "hf":
        from linlm.hf.llama import to_hf_llama

        model = to_hf_llama(model)
        model.config._attn_implementation = "sdpa"
    model.train()
    ids = torch.randint(0, args.vocab, (args.batch, n))
    return name, cfg, make_step(model, ids, mode)


def time_rounds(entries, n: int, args, phase: str) -> list[dict]:
    """Build every model of a phase first, then time them in interleaved rounds, so that drift in the machine's
    load (or first-touch memory costs) does not favour whichever model happens to run first."""
    runs = [build(arch, mode, n, args) for arch, mode in entries]
    times = {name: [] for name, _, _ in runs}
    faults = {name: [] for name, _, _ in runs}  # minor page faults per step (fresh memory touched)
    for _ in range(args.warmup):
        for name, _, step in runs:
            step()
    for i in range(args.repeat):
        # Every other round runs in reverse order, so that no model always follows the same neighbour.
        for name, _, step in (runs if i % 2 == 0 else runs[::-1]):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            times[name].append(time_fn(step, warmup=0, repeat=1))
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    out = []
    for name, cfg, _ in runs:
        seconds = statistics.median(times[name])
        tokens = args.batch * n
        c = count(cfg, batch=args.batch, seq_len=n)
        flops = (c["flops_per_token"] + c["lm_head_flops_per_token"]) * tokens
        out.append(dict(arch=name, phase=phase, seq_len=n, batch=args.batch, seconds_per_step=seconds,
                        step_seconds=times[name], tokens_per_s=tokens / seconds, model_flops_per_step=flops,
                        page_faults_per_step=statistics.median(faults[name])))
        print(f"  [{phase}] {name:>22} n={n}: {tokens / seconds:8.1f} tok/s, "
              f"{statistics.median(faults[name]):,.0f} page faults/step", flush=True)
    del runs
    gc.collect()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--archs", nargs="+", default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' LlamaForCausalLM")
    args = ap.parse_args(argv)
    archs = args.archs or list(ARCHITECTURES)
    peak = matmul_flops_per_s()
    results = []
    for n in args.seq_lens:
        # Phase "archs": every architecture through its training path, against our LLaMA.
        results += time_rounds([(a, "fused") for a in archs], n, args, "archs")
        # Phase "hf": our LLaMA against transformers' in rounds of their own (the other models freed first, so
        # that this pair does not share the heap with them): ours through its training path and through the
        # same logits + F.cross_entropy path as transformers'.
        if "llama" in archs and not args.no_hf:
            results += time_rounds([("llama", "fused"), ("llama", "logits"), ("llama", "hf")], n, args, "hf")
    # Measured again at the end, the best of both: MFU is then a lower bound, never inflated by a slow moment.
    peak = max(peak, matmul_flops_per_s())
    for r in results:
        r["mfu"] = r["model_flops_per_step"] / r["seconds_per_step"] / peak
    for r in results:
        same = [x for x in results if x["seq_len"] == r["seq_len"] and x["phase"] == r["phase"]]
        base = next((x for x in same if x["arch"] == "llama"), None)
        if base is not None:
            r["ratio_vs_our_llama"] = r["tokens_per_s"] / base["tokens_per_s"]
        hf_row = next((x for x in same if x["arch"] == "llama (transformers)"), None)
        if r["arch"] in ("llama", "llama (logits + CE)") and hf_row:
            r["ratio_vs_hf_llama"] = r["tokens_per_s"] / hf_row["tokens_per_s"]
            # The same ratio within each interleaved round: how steady the comparison is.
            r["ratio_vs_hf_llama_per_round"] = [h / o for o, h in zip(r["step_seconds"], hf_row["step_seconds"])]
    rows = [[r["arch"], r["phase"], r["seq_len"], f"{r['tokens_per_s']:.0f}",
             f"{r['ratio_vs_our_llama']:.2f}x" if "ratio_vs_our_llama" in r else "",
             f"{r['ratio_vs_hf_llama']:.2f}x" if "ratio_vs_hf_llama" in r else "",
             f"{100 * r['mfu']:.1f}%"] for r in results]
    print_table(["arch", "phase", "seq", "tokens/s", "vs our llama", "vs HF llama", "MFU"], rows)
    print(f"matmul ceiling measured in this run: {peak / 1e9:.0f} GFLOP/s (fp32, n=2048)")
    for r in results:
        if "ratio_vs_hf_llama_per_round" in r:
            per = ", ".join(f"{x:.3f}" for x in r["ratio_vs_hf_llama_per_round"])
            print(f"{r['arch']} vs transformers at seq {r['seq_len']}, round by round: {per}")
    write_json("bench_train_step", dict(meta=meta(), matmul_flops_per_s=peak, vocab=args.vocab, results=results,
                                        targets={"our_llama_vs_hf": 1.0, "linear_vs_llama_2048": 1.0,
                                                 "linear_vs_llama_8192": 1.4}))
    return 0


if __name__ == "__main__":
    from _common import apply_runtime_settings

    apply_runtime_settings()
    sys.exit(main())
