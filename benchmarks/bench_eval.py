"""Zero-shot scoring speed: shared-context scoring against naive per-choice scoring, on hellaswag-like items.

    python benchmarks/bench_eval.py [--archs tnl llama] [--preset paper-70m] [--vocab 0] [--items 96] [--repeat 2]
                                    [--threads 1]

The default model is the paper's smallest (paper-70m, with its vocabulary of 100,280): writes
benchmarks/results/bench_eval.json. Other shapes, e.g. ``--preset small --vocab 8192 --items 768``, write
bench_eval_<preset>_v<vocab>.json.

An item is a context and 4 continuations, with HellaSwag's shape: the contexts average 226 characters and the
endings 135 (measured on the validation set), about 4.4 characters per token for an English BPE, so contexts of
30-75 tokens and endings of 20-40 (random token ids: the speed does not depend on their values). 96 items give
about 2 items per context length, so most batches mix lengths and the shared way runs the tokens past the batch's
shortest context once per choice (see "token ratio"); the real validation set (10,042 items) has over a hundred
per length, so nearly all of its batches hold contexts of one length (``--items 768``: about 17 per length). Three ways, timed in interleaved rounds in one
process, medians:

- shared: linlm's scoring (each context prefilled once, its state reused by the 4 continuations; the head only
  where a log-likelihood is read);
- naive: linlm's scoring with shared=False: each choice in its own full pass over context + continuation, logits
  at every position (as a plain full pass computes them), then log-softmax at the scored positions only;
- harness-style: what lm-evaluation-harness' HF model does: every (context, choice) pair a request, sorted by
  total length, right-padded forwards, log-softmax over every position of the batch, then gather and argmax.
All three run 2 x batch_size rows to a forward. "token ratio" is the token positions the naive way runs per
position the shared way runs (the work saved, before the head). Reports items/s and the ratios, and the largest
log-likelihood difference of the other two ways from the shared one; writes benchmarks/results/bench_eval.json.
The machine's load moves absolute timings a lot: compare the ratios of one run.
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
from linlm.models.presets import preset_config  # noqa: E402
from linlm.models.registry import arch_names  # noqa: E402
from linlm.eval.scoring import Request, ScoreStats, score_requests  # noqa: E402


def hellaswag_like(n: int, vocab: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ctx = [rng.randrange(1, vocab) for _ in range(rng.randint(30, 75))]
        conts = [[rng.randrange(1, vocab) for _ in range(rng.randint(20, 40))] for _ in range(4)]
        out.append(Request(ctx, conts))
    return out


@torch.no_grad()
def harness_style(model, items: list[Request], batch_size: int) -> list[list[float]]:
    """Per-choice scoring as lm-evaluation-harness' HF model does it: every (context, choice) pair is a request;
    requests sorted by total length, longest first, run right-padded (here 2 x batch_size to a forward, the rows of
    a linlm forward), log-softmax over every position of the batch, then the continuation's log-probabilities
    gathered and its greedy check made with an argmax."""
    pairs = [(i, j, r.context + c, len(c)) for i, r in enumerate(items) for j, c in enumerate(r.continuations)]
    pairs.sort(key=lambda p: -len(p[2]))
    out = [[0.0] * len(r.continuations) for r in items]
    greedy = [[False] * len(r.continuations) for r in items]  # computed, as the harness does; not returned
    step = 2 * batch_size
    for g in range(0, len(pairs), step):
        group = pairs[g:g + step]
        T = len(group[0][2]) - 1
        ids = torch.zeros(len(group), T, dtype=torch.long)
        for k, (_, _, seq, _) in enumerate(group):
            ids[k, :len(seq) - 1] = torch.tensor(seq[:-1])
        logp = torch.log_softmax(model(ids).float(), dim=-1)
        for k, (i, j, seq, m) in enumerate(group):
            n = len(seq) - 1
            cont = logp[k, n - m:n]
            tgt = torch.tensor(seq[-m:])
            greedy[i][j] = bool((cont.argmax(-1) == tgt).all())
            out[i][j] = float(cont.gather(-1, tgt[:, None]).sum())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--archs", nargs="*", default=arch_names(),
                    help="architectures (default: every registered one, %(default)s)")
    ap.add_argument("--preset", default="paper-70m")
    ap.add_argument("--vocab", type=int, default=0, help="0: the preset's own (paper presets: 100,280)")
    ap.add_argument("--items", type=int, default=96)
    ap.add_argument("--batch-size", type=int, default=16, help="linlm eval's default")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    apply_runtime_settings()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vocab = args.vocab or preset_config(args.archs[0], args.preset).vocab_size
    items = hellaswag_like(args.items, vocab)
    rows, results = [], []
    for arch in args.archs:
        model = create_model(arch, preset=args.preset, **({"vocab_size": args.vocab} if args.vocab else {})).eval()
        ways = {"shared": True, "naive": False, "harness": None}

        def run(way, reqs, stats=None):
            if ways[way] is None:
                return harness_style(model, reqs, args.batch_size)
            return score_requests(model, reqs, batch_size=args.batch_size, shared=ways[way], stats=stats)

        # The three ways must agree before they are timed.
        ref = [s.logliks for s in run("shared", items[:4])]
        err = max(abs(x - y) for other in ([s.logliks for s in run("naive", items[:4])], run("harness", items[:4]))
                  for ra, rb in zip(ref, other) for x, y in zip(ra, rb))
        times: dict[str, list[float]] = {w: [] for w in ways}
        work: dict[str, int] = {}
        import time

        for w in ways:  # warm-up
            run(w, items[:args.batch_size])
        for _ in range(args.repeat):  # interleaved rounds: the machine's load hits the three ways alike
            for w in ways:
                stats = ScoreStats()
                t0 = time.perf_counter()
                run(w, items, stats)
                times[w].append(time.perf_counter() - t0)
                if ways[w] is not None:
                    work[w] = stats.forward_tokens
        med = {w: sorted(t)[len(t) // 2] for w, t in times.items()}
        ips = {w: args.items / med[w] for w in ways}
        ratio = ips["shared"] / ips["naive"]
        ratio_h = ips["shared"] / ips["harness"]
        rows.append([arch, f"{ips['harness']:.1f}", f"{ips['naive']:.1f}", f"{ips['shared']:.1f}", f"{ratio_h:.2f}x",
                     f"{ratio:.2f}x", f"{work['naive'] / work['shared']:.2f}x", f"{err:.1e}"])
        results.append({"arch": arch, "items_per_s": ips, "seconds": times, "forward_tokens": work,
                        "speedup": ratio, "speedup_vs_harness_style": ratio_h, "max_abs_loglik_diff": err})
    print(f"preset {args.preset}, vocab {vocab}, {args.items} items x 4 choices, batch {args.batch_size}, "
          f"{torch.get_num_threads()} threads")
    print_table(["arch", "harness-style items/s", "naive items/s", "shared items/s", "vs harness-style",
                 "vs naive", "token ratio", "max |dll|"], rows)
    name = "bench_eval" if args.preset == "paper-70m" and not args.vocab else f"bench_eval_{args.preset}_v{vocab}"
    path = write_json(name, {"meta": meta(), "config": vars(args), "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
