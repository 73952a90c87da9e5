"""The on-disk format of prepared token data: one definition for the writer (:mod:`linlm.data.prepare`) and the
reader (:mod:`linlm.data.loader`).

A prepared directory::

    meta.json               written last: its presence means the directory is complete
    tokenizer.json          the tokenizer used (plus tokenizer_config.json, so transformers can load it too)
    train/000000.bin ...    raw token ids, little-endian uint16 (vocab <= 65536) or uint32, shard_tokens each;
                            meta.json records each shard's sha256 and the sha256 of each 4 MiB block of it
                            (linlm.data.checksums), verified by the reader
    val/000000.bin ...      (the last shard of a split is shorter)
    .progress/              only while incomplete: state.json and the pending tail of each split

meta.json (:data:`FORMAT`): ``dtype`` (a numpy name, stored little-endian), ``vocab_size``, ``eos_id``,
``tokenizer`` (``file``, ``spec``, ``fingerprint``), ``source`` (``spec``, ``fingerprint`` and counts), ``config``
(the settings the data was prepared with) and ``splits``: for each split its ``tokens``, ``pieces`` and
``shards``, a list of ``{"file", "tokens", "sha256", "blocks"}`` in stream order.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import numpy as np

from linlm import outputs
from linlm.data.checksums import shard_checksums
from linlm.data.tokenizer import TOKENIZER_CONFIG_FILE
from linlm.data.tokenizer import TOKENIZER_FILE
from linlm.errors import DataError

FORMAT = "linlm-tokens/1"
META_FILE = "meta.json"
PROGRESS_DIR = ".progress"
STATE_FILE = "state.json"
PROGRESS_FILE = f"{PROGRESS_DIR}/{STATE_FILE}"
SPLITS = ("train", "val")

# Every path the format defines, relative to the directory: a user's file at one of them is in the writer's way.
_NAMES = (META_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, *SPLITS, PROGRESS_DIR)
_PATHS = re.compile(rf"^(({'|'.join(SPLITS)})/\d{{6}}\.bin"
                    rf"|{re.escape(PROGRESS_DIR)}/({re.escape(STATE_FILE)}|pending-.*))$")


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest dtype that holds every id of a vocabulary: uint16 up to 65536 entries, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def stored_dtype(dtype: "np.dtype | str") -> np.dtype:
    """``dtype`` (or meta.json's ``dtype`` name) in the byte order of the shards: little-endian."""
    return np.dtype(dtype).newbyteorder("<")


def shard_file(split: str, index: int) -> str:
    """The path of a split's ``index``-th shard, relative to the directory (``train/000003.bin``)."""
    return f"{split}/{index:06d}.bin"


def is_format_path(rel: str) -> bool:
    """Whether ``rel`` (a posix path relative to the directory) is a path the format defines."""
    return rel in _NAMES or bool(_PATHS.match(rel))


def shard_size_problem(path: Path, tokens: int, dtype: np.dtype) -> Optional[str]:
    """None when the shard at ``path`` holds ``tokens`` tokens of ``dtype``; else what is wrong."""
    expected = tokens * np.dtype(dtype).itemsize
    got = path.stat().st_size if path.is_file() else "missing"
    return None if got == expected else f"expected {expected} bytes ({tokens} tokens), found {got}"


class SplitWriter:
    """Collects one split's tokens and writes them out in shards of exactly ``shard_tokens``.

    ``record`` is the split's entry in the writer's progress state (``shards``, ``pieces``, ``pending``,
    ``pending_tokens``) and is updated in place: each shard written is appended to ``shards``, and
    :meth:`save_pending` stores the tokens not yet in a shard under ``.progress`` so that a resumed writer
    continues exactly where the state says. ``what`` names the directory in messages (:mod:`linlm.outputs`)."""

    def __init__(self, out: Path, split: str, dtype: np.dtype, shard_tokens: int, record: dict, what: str):
        self.out, self.split, self.dtype, self.shard_tokens = out, split, stored_dtype(dtype), shard_tokens
        self.record, self.what = record, what
        self.chunks: list[np.ndarray] = []
        self.count = 0
        if record["pending"]:
            path = out / PROGRESS_DIR / record["pending"]
            tail = np.fromfile(path, dtype=self.dtype) if path.is_file() else np.empty(0, self.dtype)
            if len(tail) != record["pending_tokens"]:
                raise DataError(f"{path}: holds {len(tail)} tokens, the progress state expects "
                                f"{record['pending_tokens']}; rerun with overwrite=True / --overwrite")
            self.chunks, self.count = [tail], len(tail)
        outputs.make_dir(out / split, what)

    def add(self, ids: np.ndarray) -> list[dict]:
        """Append ``ids``; returns the records of the shards this completed."""
        self.chunks.append(ids)
        self.count += len(ids)
        written = []
        if self.count >= self.shard_tokens:
            data = np.concatenate(self.chunks)
            start = 0
            while len(data) - start >= self.shard_tokens:
                written.append(self._write(data[start:start + self.shard_tokens]))
                start += self.shard_tokens
            self.chunks, self.count = [data[start:]], len(data) - start
        return written

    def finish(self) -> list[dict]:
        """Write what is left as the split's last (shorter) shard."""
        if not self.count:
            return []
        data = np.concatenate(self.chunks)
        self.chunks, self.count = [], 0
        return [self._write(data)]

    def _bytes(self, tokens: np.ndarray) -> bytes:
        return tokens.astype(self.dtype, copy=False).tobytes()

    def _write(self, tokens: np.ndarray) -> dict:
        name = shard_file(self.split, len(self.record["shards"]))
        blob = self._bytes(tokens)
        outputs.write_bytes(self.out / name, blob, self.what)
        shard = {"file": name, "tokens": len(tokens), **shard_checksums(blob)}
        self.record["shards"].append(shard)
        return shard

    def save_pending(self, checkpoint: int) -> Optional[str]:
        """Store the tokens not yet in a shard as the pending tail of ``checkpoint``; returns the name of the
        tail it replaces (the caller removes it once the state that names the new one is committed)."""
        old = self.record["pending"]
        name = f"pending-{self.split}-{checkpoint:06d}.bin" if self.count else None
        if name:
            data = np.concatenate(self.chunks)
            self.chunks = [data]
            outputs.write_bytes(self.out / PROGRESS_DIR / name, self._bytes(data), self.what)
        self.record["pending"], self.record["pending_tokens"] = name, self.count
        return old
