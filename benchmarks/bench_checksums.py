"""What shard checksums cost: writing them at prepare time, and verifying them as a TokenDataset reads.

Builds a prepared-data directory with one train shard of --mb MB of uint16 tokens (random ids, in the page
cache: this measures hashing, not the disk), then times, each as the median of --repeat runs in this process:

* ``record``: shard_checksums of the shard bytes (what `linlm data prepare` adds per shard);
* ``open``: TokenDataset(dir) (verifies nothing yet);
* ``verify_all``: TokenDataset(dir, verify=True) (every block);
* ``epoch_verified`` / ``epoch_unverified``: reading every seq_len window once in a random order (one epoch of
  Batches.batch reads), on a fresh dataset (each block hashed at its first use) and on one whose checksums are
  switched off. Their difference is what verification adds to a first epoch; later epochs hash nothing.

Prints a table and writes benchmarks/results/bench_checksums.json.

    python benchmarks/bench_checksums.py [--mb 100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, write_json  # noqa: E402

from linlm.data.checksums import BLOCK_BYTES, shard_checksums  # noqa: E402
from linlm.data.loader import TokenDataset  # noqa: E402


def build(root: Path, mb: int, vocab: int = 50_000) -> bytes:
    tokens = np.random.default_rng(0).integers(0, vocab, size=mb * (1 << 20) // 2, dtype=np.uint16)
    blob = tokens.astype("<u2").tobytes()
    (root / "train").mkdir(parents=True)
    (root / "train" / "000000.bin").write_bytes(blob)
    shard = {"file": "train/000000.bin", "tokens": len(tokens), **shard_checksums(blob)}
    (root / "meta.json").write_text(json.dumps({
        "format": "linlm-tokens/1", "dtype": "uint16", "vocab_size": vocab, "eos_id": 0,
        "tokenizer": {"spec": "bpe:50000"}, "source": {"spec": "random"}, "config": {"val_fraction": 0.0},
        "splits": {"train": {"tokens": len(tokens), "pieces": 1, "shards": [shard]}}}))
    return blob


def epoch(ds: TokenDataset, seq_len: int) -> float:
    order = np.random.default_rng(1).permutation(ds.num_sequences(seq_len))
    started = time.perf_counter()
    for i in order:
        ds.read(int(i) * seq_len, seq_len + 1)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    times: dict[str, list[float]] = {k: [] for k in ("record", "open", "verify_all", "epoch_verified",
                                                     "epoch_unverified")}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        blob = build(root, args.mb)
        for _ in range(args.repeat):
            t = time.perf_counter()
            shard_checksums(blob)
            times["record"].append(time.perf_counter() - t)
            t = time.perf_counter()
            TokenDataset(root)
            times["open"].append(time.perf_counter() - t)
            t = time.perf_counter()
            TokenDataset(root, verify=True)
            times["verify_all"].append(time.perf_counter() - t)
            times["epoch_verified"].append(epoch(TokenDataset(root), args.seq_len))
            plain = TokenDataset(root)
            for v in plain._verifiers:
                v.has_checksums = False
            times["epoch_unverified"].append(epoch(plain, args.seq_len))
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [[k, f"{v * 1e3:.1f} ms", f"{args.mb / v:.0f} MB/s" if k in ("record", "verify_all") else ""]
            for k, v in med.items()]
    overhead = med["epoch_verified"] / med["epoch_unverified"]
    rows.append(["epoch_verified / epoch_unverified", f"{overhead:.3f}x", ""])
    print(f"shard checksums: {args.mb} MB shard, {BLOCK_BYTES >> 20} MiB blocks, seq_len {args.seq_len}")
    print_table(["what", f"median of {args.repeat}", "rate"], rows)
    write_json("bench_checksums", {"meta": meta(), "mb": args.mb, "block_bytes": BLOCK_BYTES,
                                   "seq_len": args.seq_len, "repeat": args.repeat, "median_seconds": med,
                                   "first_epoch_ratio": overhead, "samples": times})


if __name__ == "__main__":
    main()
