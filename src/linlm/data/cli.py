"""``linlm data ...``: thin wrappers over :mod:`linlm.data`."""

from __future__ import annotations

import argparse
import time

from linlm.data.prepare import DEFAULT_SHARD_TOKENS, DEFAULT_SPLIT_CHARS


def register(subparsers) -> None:
    from linlm.cli_ranges import RANGES

    data = subparsers.add_parser("data", help="prepare tokenised training data")
    sub = data.add_subparsers(dest="data_command", required=True)
    p = sub.add_parser(
        "prepare", help="tokenise a source into shards with a train/val split",
        description="Tokenise SOURCE into memory-mapped shards in OUT (resumable; re-running a finished OUT with "
                    "the same settings does nothing).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--source", required=True,
                   help="'shakespeare' (built-in), a file, a directory, a glob, or hf:NAME[:CONFIG][@SPLIT]")
    p.add_argument("--tokenizer", required=True,
                   help="bpe:VOCAB to train a byte-level BPE, or a tokenizer.json / directory / hub name")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--val-fraction", type=RANGES["fraction"], default=0.005, help="fraction of pieces for validation")
    p.add_argument("--text-field", default="text", help="field (JSON lines, HF) or column (Parquet) with the text")
    p.add_argument("--seed", type=RANGES["seed"], default=0, help="seed of the train/validation split")
    p.add_argument("--shard-tokens", type=RANGES["tokens"], default=DEFAULT_SHARD_TOKENS, help="tokens per shard")
    p.add_argument("--split-chars", type=RANGES["chars"], default=DEFAULT_SPLIT_CHARS,
                   help="documents are cut into pieces of at most this many characters for the split")
    p.add_argument("--num-workers", type=RANGES["workers"], default=2, help="tokenizer threads (1: no parallelism)")
    p.add_argument("--overwrite", action="store_true", help="replace an output made with other settings")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=handle_prepare)


def handle_prepare(args) -> int:
    from linlm.data.prepare import prepare

    started = time.perf_counter()
    meta = prepare(args.source, args.tokenizer, args.out, val_fraction=args.val_fraction, seed=args.seed,
                   shard_tokens=args.shard_tokens, split_chars=args.split_chars, text_field=args.text_field,
                   num_workers=args.num_workers, overwrite=args.overwrite, progress=args.progress)
    elapsed = time.perf_counter() - started
    src = meta["source"]
    print(f"{args.out}: {src['documents']:,} documents, {src['bytes'] / 1e6:.1f} MB from {src['spec']}, "
          f"vocab {meta['vocab_size']:,} ({meta['dtype']}), {elapsed:.1f} s")
    for name, split in meta["splits"].items():
        print(f"  {name:5s} {split['tokens']:>14,} tokens in {len(split['shards'])} shard(s)")
    if src["utf8_replacements"]:
        print(f"  warning: {src['utf8_replacements']:,} invalid UTF-8 sequences were replaced by U+FFFD")
    return 0
