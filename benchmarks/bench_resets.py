"""What data.document_resets costs: one training step (forward + backward) with and without the reset tensor.

Each architecture runs both sides in this process, warmed up, in interleaved rounds (medians), on a packed batch
whose documents are about ``--doc-len`` tokens long. LLaMA turns resets into a block-diagonal attention mask
(SDPA with an explicit mask instead of its causal kernel); the linear-attention models zero their state at each
reset inside the chunked scan. Prints a table and writes benchmarks/results/bench_resets.json.

    python benchmarks/bench_resets.py [--archs llama tnl hgrn2 mamba] [--seq-len 1024] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, time_fn, write_json  # noqa: E402

from linlm.models.lm import create_model  # noqa: E402
from linlm.models.registry import arch_names  # noqa: E402


def packed_batch(batch: int, seq_len: int, vocab: int, doc_len: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=g)
    targets = torch.randint(0, vocab, (batch, seq_len), generator=g)
    reset = torch.rand(batch, seq_len, generator=g) < 1.0 / doc_len
    reset[:, 0] = True
    return ids, targets, reset


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", nargs="*", default=arch_names(),
                    help="architectures (default: every registered one, %(default)s)")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--doc-len", type=int, default=200, help="mean document length in tokens")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    vocab = 4096
    rows, results = [], []
    for arch in args.archs:
        torch.manual_seed(0)
        model = create_model(arch, preset=args.preset, vocab_size=vocab, max_seq_len=args.seq_len)
        ids, targets, reset = packed_batch(args.batch, args.seq_len, vocab, args.doc_len)

        def step(with_reset: bool):
            model.zero_grad(set_to_none=True)
            model(ids, targets=targets, reset=reset if with_reset else None).loss.backward()

        plain, resets = [], []
        for _ in range(args.repeat):  # interleaved rounds: drift in machine load hits both sides alike
            plain.append(time_fn(lambda: step(False), warmup=1, repeat=1))
            resets.append(time_fn(lambda: step(True), warmup=1, repeat=1))
        p, r = statistics.median(plain), statistics.median(resets)
        tokens = args.batch * args.seq_len
        results.append({"arch": arch, "plain_s": p, "resets_s": r, "ratio": r / p, "plain_tokens_per_s": tokens / p,
                        "resets_tokens_per_s": tokens / r, "documents_per_row": float(reset.sum()) / args.batch})
        rows.append([arch, p, r, f"{r / p:.2f}x"])
    print_table(["arch", "step s (no resets)", "step s (resets)", "resets / plain"], rows)
    path = write_json("bench_resets", {"meta": meta(), "args": vars(args), "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    from _common import apply_runtime_settings

    apply_runtime_settings()
    sys.exit(main())
