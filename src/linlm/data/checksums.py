"""Checksums of token shards, verified blockwise as the shards are read.

``linlm data prepare`` records, for every shard in meta.json, the sha256 of the whole shard (``sha256``) and of
each block of :data:`BLOCK_BYTES` bytes (``blocks``: ``{"bytes": B, "sha256": [...]}``; the last block is
shorter). A reader verifies a block the first time it reads from it, before the tokens are used, so:

* a shard changed in place (same size, other bytes) is found before a single token of the changed block
  reaches a model, at any size of dataset;
* the cost is one sha256 pass over the data a process actually reads (about 1 GB/s on one core), spread over
  the reads instead of paid up front, and nothing is hashed twice by one reader;
* shards from before block checksums (only ``sha256``) are verified as one block; shards with no checksum at all
  are read with a warning.
"""

from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np

# 4 MiB: hashing one block costs a few milliseconds, and meta.json grows by ~70 bytes per 4 MiB of tokens.
BLOCK_BYTES = 1 << 22


def block_digests(blob: bytes | memoryview, block_bytes: Optional[int] = None) -> list[str]:
    """sha256 hex digests of consecutive ``block_bytes`` blocks (default :data:`BLOCK_BYTES`) of ``blob``."""
    block_bytes = block_bytes or BLOCK_BYTES
    view = memoryview(blob).cast("B")
    return [hashlib.sha256(view[i:i + block_bytes]).hexdigest() for i in range(0, len(view), block_bytes)]


def shard_checksums(blob: bytes, block_bytes: Optional[int] = None) -> dict:
    """The checksum entries of a shard's record in meta.json."""
    block_bytes = block_bytes or BLOCK_BYTES
    return {"sha256": hashlib.sha256(blob).hexdigest(),
            "blocks": {"bytes": block_bytes, "sha256": block_digests(blob, block_bytes)}}


class ShardVerifier:
    """Verifies the blocks of one memory-mapped shard on first use. ``check(start, stop)`` takes token indices."""

    def __init__(self, tokens: np.ndarray, record: dict):
        self.tokens = tokens
        nbytes = tokens.nbytes
        blocks = record.get("blocks")
        if blocks:
            self.block_bytes, self.digests = int(blocks["bytes"]), list(blocks["sha256"])
        elif record.get("sha256"):  # prepared before block checksums: the whole shard is one block
            self.block_bytes, self.digests = max(nbytes, 1), [record["sha256"]]
        else:
            self.block_bytes, self.digests = max(nbytes, 1), []
        self.has_checksums = bool(self.digests)
        expected_blocks = -(-nbytes // self.block_bytes)
        if self.has_checksums and len(self.digests) != expected_blocks:
            self.bad_metadata: Optional[str] = (f"meta.json lists {len(self.digests)} block checksums for "
                                                f"{expected_blocks} blocks")
        else:
            self.bad_metadata = None
        self.verified = np.zeros(len(self.digests), dtype=bool)
        self.itemsize = tokens.itemsize

    def check(self, start: int, stop: int) -> Optional[str]:
        """None when tokens ``[start, stop)`` lie in verified blocks; otherwise what is wrong."""
        if not self.has_checksums or stop <= start:
            return None
        if self.bad_metadata:
            return self.bad_metadata
        first = start * self.itemsize // self.block_bytes
        last = ((stop * self.itemsize) - 1) // self.block_bytes
        for b in range(first, last + 1):
            if self.verified[b]:
                continue
            lo, hi = b * self.block_bytes, min((b + 1) * self.block_bytes, self.tokens.nbytes)
            raw = memoryview(self.tokens).cast("B")[lo:hi]
            if hashlib.sha256(raw).hexdigest() != self.digests[b]:
                return f"bytes {lo}-{hi} do not match their sha256 in meta.json"
            self.verified[b] = True
        return None
