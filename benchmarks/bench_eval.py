"""Zero-shot scoring speed: shared-context scoring against naive per-choice scoring, on hellaswag-like items.

    python benchmarks/bench_eval.py [--archs tnl llama] [--preset small] [--items 96] [--repeat 2] [--threads 1]

An item is a context and 4 continuations, with HellaSwag's shape: the contexts average 226 characters and the
endings 135 (measured on the validation set), about 4.4 characters per token for an English BPE, so contexts of
30-75 tokens and endings of 20-40 (random token ids: the speed does not depend on their values). Three ways,
timed in interleaved rounds in one process, medians:

- shared: linlm's scoring (each context prefilled once, its state reused by the 4 continuations; the head only
  where a log-likelihood is read);
- naive: each choice scored in its own full pass over context + continuation, logits at every position (what a
  plain per-choice evaluator does; the default of lm-evaluation-harness' HF model).
Both batch items by length. "token ratio" is the token positions the naive way runs per position the shared way
runs (the work saved, before the head). Reports items/s and the ratio; writes benchmarks/results/bench_eval.json.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import apply_runtime_settings, meta, print_table, write_json  # noqa: E402

from linlm import create_model  # noqa: E402
from linlm.eval.scoring import Request, ScoreStats, score_requests  # noqa: E402


def hellaswag_like(n: int, vocab: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ctx = [rng.randrange(1, vocab) for _ in range(rng.randint(30, 75))]
        conts = [[rng.randrange(1, vocab) for _ in range(rng.randint(20, 40))] for _ in range(4)]
        out.append(Request(ctx, conts))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--archs", nargs="*", default=["tnl", "hgrn2", "llama", "mamba"])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--items", type=int, default=96)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    apply_runtime_settings()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    items = hellaswag_like(args.items, args.vocab)
    rows, results = [], []
    for arch in args.archs:
        model = create_model(arch, preset=args.preset, vocab_size=args.vocab).eval()
        ways = {"shared": True, "naive": False}
        # Both ways must agree before they are timed.
        a = score_requests(model, items[:4], batch_size=args.batch_size, shared=True)
        b = score_requests(model, items[:4], batch_size=args.batch_size, shared=False)
        err = max(abs(x - y) for sa, sb in zip(a, b) for x, y in zip(sa.logliks, sb.logliks))
        times: dict[str, list[float]] = {w: [] for w in ways}
        work: dict[str, int] = {}
        import time

        for w, shared in ways.items():  # warm-up
            score_requests(model, items[:args.batch_size], batch_size=args.batch_size, shared=shared)
        for _ in range(args.repeat):
            for w, shared in ways.items():
                stats = ScoreStats()
                t0 = time.perf_counter()
                score_requests(model, items, batch_size=args.batch_size, shared=shared, stats=stats)
                times[w].append(time.perf_counter() - t0)
                work[w] = stats.forward_tokens
        med = {w: sorted(t)[len(t) // 2] for w, t in times.items()}
        ips = {w: args.items / med[w] for w in ways}
        ratio = ips["shared"] / ips["naive"]
        rows.append([arch, f"{ips['naive']:.1f}", f"{ips['shared']:.1f}", f"{ratio:.2f}x",
                     f"{work['naive'] / work['shared']:.2f}x", f"{err:.1e}"])
        results.append({"arch": arch, "items_per_s": ips, "seconds": times, "forward_tokens": work,
                        "speedup": ratio, "max_abs_loglik_diff": err})
    print(f"preset {args.preset}, vocab {args.vocab}, {args.items} items x 4 choices, batch {args.batch_size}, "
          f"{torch.get_num_threads()} threads")
    print_table(["arch", "naive items/s", "shared items/s", "speedup", "token ratio", "max |dll|"], rows)
    path = write_json("bench_eval", {"meta": meta(), "config": vars(args), "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
