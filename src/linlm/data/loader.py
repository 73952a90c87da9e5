"""Read prepared token shards (laid out as :mod:`linlm.data.shards` defines): a dataset over their memory maps
and a resumable batch iterator.

Sequences: the split's token stream (all shards, in order) is cut into ``N = (tokens - 1) // seq_len``
non-overlapping windows; window ``i`` is tokens ``[i*T, i*T + T + 1)`` (T = ``seq_len``), giving the inputs
(first T) and the next-token targets (last T). Windows cross document and shard boundaries; documents are
separated by the end-of-text id, and ``return_resets=True`` marks where a new document starts.

Order: the windows of epoch ``e`` are visited in the order of a permutation drawn from ``(seed, e)``
(the identity when ``shuffle=False``), and the epochs are laid end to end into one endless stream. Step ``s``
takes the *global batch* of stream positions ``[s*G, (s+1)*G)`` with ``G = batch_size * world_size``, and rank
``r`` takes positions ``[s*G + r*B, s*G + (r+1)*B)`` of it (B = ``batch_size``, per rank). Hence:

* the ranks of one step read disjoint windows (as long as G <= N: an epoch has no repeated window);
* concatenating the ranks' batches in rank order gives exactly the 1-rank batch of size G: a run with
  ``world_size=2, batch_size=B/2`` sees the same global batch at every step as ``world_size=1, batch_size=B``;
* a batch is a pure function of the step, so resuming needs only the step (``state_dict``), and resuming with
  a different world size is allowed as long as the global batch size G is unchanged.

A batch may straddle two epochs; no window is ever dropped.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from linlm.data.checksums import ShardVerifier
from linlm.data.shards import META_FILE, PROGRESS_DIR, shard_size_problem, stored_dtype
from linlm.errors import ConfigError, DataError, choices_text

log = logging.getLogger("linlm.data")


class TokenDataset:
    """The token stream of one split of a prepared directory, over read-only memory maps of its shards."""

    def __init__(self, directory: str | Path, split: str = "train", *, verify: bool = False):
        self.directory = Path(directory).expanduser()
        meta_path = self.directory / META_FILE
        if not meta_path.is_file():
            hint = (" (an interrupted `linlm data prepare`; run it again to finish)"
                    if (self.directory / PROGRESS_DIR).is_dir() else "; run `linlm data prepare` first")
            raise DataError(f"{self.directory}: no {META_FILE}, so not a complete prepared data directory{hint}")
        raw = meta_path.read_bytes()
        self.meta: dict[str, Any] = json.loads(raw)
        self.fingerprint = hashlib.sha256(raw).hexdigest()
        if split not in self.meta["splits"]:
            raise DataError(f"{meta_path}: no split {split!r}; choose from {choices_text(self.meta['splits'])}")
        self.split = split
        self.dtype = stored_dtype(self.meta["dtype"])
        self.vocab_size: int = self.meta["vocab_size"]
        self.eos_id: int = self.meta["eos_id"]
        self._shards: list[np.memmap] = []
        self._paths: list[Path] = []
        self._verifiers: list[ShardVerifier] = []
        for shard in self.meta["splits"][split]["shards"]:
            path = self.directory / shard["file"]
            problem = shard_size_problem(path, shard["tokens"], self.dtype)
            if problem:
                raise DataError(f"{path}: {problem}; the directory is damaged; {self.prepare_again()}")
            tokens = np.memmap(path, dtype=self.dtype, mode="r")
            self._shards.append(tokens)
            self._paths.append(path)
            self._verifiers.append(ShardVerifier(tokens, shard))
        unchecked = sum(not v.has_checksums for v in self._verifiers)
        if unchecked:
            log.warning("%s: %d shard(s) of split %r have no checksum in %s, so corruption cannot be detected; "
                        "%s to add them", self.directory, unchecked, split, META_FILE, self.prepare_again())
        if verify:
            for i, tokens in enumerate(self._shards):
                self._verify(i, 0, len(tokens))
        sizes = [len(s) for s in self._shards]
        self._starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.num_tokens = int(self._starts[-1])

    def __len__(self) -> int:
        return self.num_tokens

    def __getstate__(self) -> dict:  # pickled (e.g. into worker processes) as a path, never as the token data
        return {"directory": self.directory, "split": self.split}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["directory"], state["split"])

    def __repr__(self) -> str:
        return f"TokenDataset({str(self.directory)!r}, {self.split!r}, tokens={self.num_tokens})"

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens ``[start, start + length)`` of the split (across shard boundaries), as a new int64 array."""
        if start < 0 or length < 0 or start + length > self.num_tokens:
            raise IndexError(f"tokens [{start}, {start + length}) out of range [0, {self.num_tokens})")
        out = np.empty(length, dtype=np.int64)
        shard = int(np.searchsorted(self._starts, start, side="right")) - 1
        done = 0
        while done < length:
            offset = start + done - int(self._starts[shard])
            take = min(length - done, len(self._shards[shard]) - offset)
            self._verify(shard, offset, offset + take)
            piece = out[done:done + take]
            piece[:] = self._shards[shard][offset:offset + take]
            if take and int(piece.max()) >= self.vocab_size:
                bad = offset + int(np.argmax(piece >= self.vocab_size))
                raise DataError(f"{self._paths[shard]}: token {bad} is id {int(piece.max())}, outside the data's "
                                f"vocabulary of {self.vocab_size} ids ({META_FILE}): the shard is corrupt; "
                                f"{self.prepare_again()}")
            done += take
            shard += 1
        return out

    def _verify(self, shard: int, start: int, stop: int) -> None:
        problem = self._verifiers[shard].check(start, stop)
        if problem:
            raise DataError(f"{self._paths[shard]}: {problem}: the shard was changed or corrupted after it was "
                            f"prepared; {self.prepare_again()}")

    def prepare_again(self) -> str:
        """The command that rebuilds this directory (from the settings recorded in meta.json)."""
        source = self.meta.get("source", {}).get("spec", "SOURCE")
        tokenizer = str(self.meta.get("tokenizer", {}).get("spec", ""))
        if not (tokenizer.startswith("bpe:") or Path(tokenizer).expanduser().exists()):
            tokenizer = "TOKENIZER"  # made from a Tokenizer object, or a file that has moved
        return (f"prepare it again with `linlm data prepare --source {source} --tokenizer {tokenizer} --out "
                f"{self.directory} --overwrite` (settings as in {META_FILE}; it never removes a file changed since "
                "linlm wrote it, so move a damaged shard away first)")

    def num_sequences(self, seq_len: int) -> int:
        return max(0, (self.num_tokens - 1) // seq_len)

    def tokenizer(self):
        """The Tokenizer saved beside the shards."""
        from linlm.data.tokenizer import Tokenizer

        return Tokenizer.from_pretrained(self.directory)


class Batches:
    """Endless, deterministic, resumable batches ``(input_ids, targets)`` of int64 tensors ``[batch_size, seq_len]``
    (plus ``resets``, bool ``[batch_size, seq_len]``, when ``return_resets``). See the module doc for the order.

    ``resets[b, t]`` is True where position t starts a fresh recurrent state: at t = 0, and wherever the previous
    input token is the end-of-text id.
    """

    def __init__(self, dataset: TokenDataset, batch_size: int, seq_len: int, *, seed: int = 0, rank: int = 0,
                 world_size: int = 1, start_step: int = 0, shuffle: bool = True, return_resets: bool = False):
        for key, value in (("batch_size", batch_size), ("seq_len", seq_len), ("world_size", world_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{key}={value!r}: expected a positive integer")
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank={rank!r}: expected 0 <= rank < world_size={world_size}")
        if start_step < 0:
            raise ConfigError(f"start_step={start_step!r}: expected >= 0")
        self.dataset = dataset
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, int(seed)
        self.rank, self.world_size, self.shuffle = rank, world_size, shuffle
        self.return_resets = return_resets
        self.global_batch_size = batch_size * world_size
        self.num_sequences = dataset.num_sequences(seq_len)
        if dataset.num_tokens == 0:
            raise DataError(f"split {dataset.split!r} of {dataset.directory} is empty (prepared with val_fraction="
                            f"{dataset.meta['config']['val_fraction']}); prepare it again with a larger "
                            "--val-fraction or a smaller --split-chars")
        if self.num_sequences < 1:
            raise DataError(f"seq_len={seq_len} needs at least {seq_len + 1} tokens (inputs plus one target), but "
                            f"split {dataset.split!r} of {dataset.directory} has {dataset.num_tokens}; use a "
                            "shorter seq_len or more data")
        self.step = start_step
        self._perm_epoch: Optional[int] = None
        self._perm: Optional[np.ndarray] = None

    @property
    def steps_per_epoch(self) -> float:
        return self.num_sequences / self.global_batch_size

    @property
    def epoch(self) -> float:
        """Epochs completed at the current step (fractional)."""
        return self.step * self.global_batch_size / self.num_sequences

    def _order(self, epoch: int) -> np.ndarray:
        if self._perm_epoch != epoch:
            if self.shuffle:
                rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
                self._perm = rng.permutation(self.num_sequences)
            else:
                self._perm = np.arange(self.num_sequences)
            self._perm_epoch = epoch
        return self._perm

    def sequence_ids(self, step: int) -> np.ndarray:
        """Window indices this rank reads at ``step``."""
        first = step * self.global_batch_size + self.rank * self.batch_size
        positions = np.arange(first, first + self.batch_size, dtype=np.int64)
        epochs, within = np.divmod(positions, self.num_sequences)
        out = np.empty(self.batch_size, dtype=np.int64)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            out[sel] = self._order(int(epoch))[within[sel]]
        return out

    def batch(self, step: int):
        """The batch of ``step`` for this rank (does not move the iterator)."""
        T = self.seq_len
        rows = np.stack([self.dataset.read(int(i) * T, T + 1) for i in self.sequence_ids(step)])
        tokens = torch.from_numpy(rows)
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        if not self.return_resets:
            return inputs, targets
        resets = torch.zeros_like(inputs, dtype=torch.bool)
        resets[:, 0] = True
        resets[:, 1:] = inputs[:, :-1] == self.dataset.eos_id
        return inputs, targets, resets

    def __iter__(self) -> "Batches":
        return self

    def __next__(self):
        out = self.batch(self.step)
        self.step += 1
        return out

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.seed, "seq_len": self.seq_len,
                "global_batch_size": self.global_batch_size, "shuffle": self.shuffle,
                "num_sequences": self.num_sequences, "data_fingerprint": self.dataset.fingerprint,
                "split": self.dataset.split}

    def load_state_dict(self, state: dict) -> None:
        """Continue at the saved step. The data, seed, seq_len, shuffle and global batch size must match."""
        mine = self.state_dict()
        for key in ("data_fingerprint", "split", "seed", "seq_len", "global_batch_size", "shuffle",
                    "num_sequences"):
            if key in state and state[key] != mine[key]:
                what = "data directory" if key == "data_fingerprint" else key
                raise DataError(f"cannot resume the batch iterator: the saved {what} is {state[key]!r} but this "
                                f"run has {mine[key]!r}; resume with the same data, seed, seq_len, shuffle and "
                                "batch_size * world_size")
        step = state.get("step")
        if not isinstance(step, int) or step < 0:
            raise DataError(f"cannot resume the batch iterator: saved step {step!r} is not a non-negative integer")
        self.step = step
