"""The training data: what the Trainer reads batches from.

The Trainer asks for a :class:`TrainData`. By default it is built from ``data.dir`` (a prepared directory) or
from ``data.source`` + ``data.tokenizer`` (prepared once into the linlm cache, under a lock, then reused); a caller
may pass its own factory ``data(cfg, rank, world_size) -> TrainData`` instead (an in-memory task such as MQAR).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from linlm.errors import ConfigError, DataError, TokenizerError

log = logging.getLogger("linlm.train")


class BatchStream(Protocol):
    """``next(stream)`` -> ``(ids, targets)`` or ``(ids, targets, reset)``, LongTensor [B, T] (targets -100 are
    ignored, reset bool [B, T]); ``state_dict()`` / ``load_state_dict()`` resume it exactly."""

    def __next__(self) -> tuple: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class TrainData:
    train: Any  # a BatchStream
    val: list  # fixed (ids, targets[, reset]) micro-batches
    vocab_size: int  # the model's vocab_size when model.overrides sets none
    tokenizer: Any = None  # None: no end-of-run samples
    directory: Optional[Path] = None  # a prepared directory whose tokenizer goes into checkpoints
    fingerprint: str = ""  # identifies the data; resume refuses another


DataFactory = Callable[[Any, int, int], TrainData]
CACHE_FORMAT = "prepared/2"


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def split_batch(batch: tuple) -> tuple[Any, Any, Optional[Any]]:
    """(ids, targets, reset or None) from a 2- or 3-tuple micro-batch."""
    if len(batch) == 3:
        return batch[0], batch[1], batch[2]
    ids, targets = batch
    return ids, targets, None


# ---- prepared data (the default) ----------------------------------------------------------------------------


def prepared_data_dir(cfg) -> Path:
    """The cache directory for data.source + data.tokenizer (prepared there when missing)."""
    from linlm.data.corpus import cache_dir

    source = cfg.data.source
    if Path(source).expanduser().exists():
        source = str(Path(source).expanduser().resolve())
    tok = cfg.data.tokenizer
    if not tok.startswith("bpe:") and Path(tok).expanduser().exists():
        tok = str(Path(tok).expanduser().resolve())
    # CACHE_FORMAT names the layout of an entry: entries of an earlier layout (prepared before linlm kept a ledger of
    # its files, so none of their files count as linlm's) are left alone, not refused or overwritten.
    key = hashlib.sha256(json.dumps([CACHE_FORMAT, source, tok, cfg.data.val_fraction]).encode()).hexdigest()[:16]
    slug = "".join(c if c.isalnum() else "-" for c in Path(cfg.data.source).name)[:32].strip("-") or "data"
    return cache_dir() / "prepared" / f"{slug}-{key}"


def resolve_data(cfg, show_progress: bool) -> Path:
    """data.dir, or the cache entry for data.source + data.tokenizer, prepared (and locked) when needed."""
    if cfg.data.dir is not None:
        return Path(cfg.data.dir).expanduser()
    from linlm.data.prepare import prepare

    target = prepared_data_dir(cfg)
    log.info("preparing %s with %s into %s", cfg.data.source, cfg.data.tokenizer, target)
    prepare(cfg.data.source, cfg.data.tokenizer, target, val_fraction=cfg.data.val_fraction, seed=0,
            overwrite=True, progress=show_progress, wait_for_lock=True)
    return target


def open_prepared(cfg, data_dir: Path, rank: int, world_size: int) -> TrainData:
    """TrainData over a prepared directory: deterministic, resumable batches, and a fixed validation set."""
    from linlm.data.loader import Batches, TokenDataset

    train_ds = TokenDataset(data_dir, "train")
    tok = train_ds.tokenizer()
    vocab = round_up(max(tok.vocab_size, train_ds.vocab_size), 64)
    model_cfg = cfg.model_config(vocab_size=vocab)
    tok.ensure_fits(model_cfg.vocab_size)
    if train_ds.vocab_size > model_cfg.vocab_size:
        raise TokenizerError(f"{data_dir}: the data holds token ids up to {train_ds.vocab_size - 1} but the model's "
                             f"vocab_size is {model_cfg.vocab_size}; raise model.overrides.vocab_size")
    if cfg.batch_size % (cfg.grad_accum * world_size):
        raise ConfigError(f"batch_size: {cfg.batch_size} is not divisible by grad_accum ({cfg.grad_accum}) x "
                          f"processes ({world_size}); choose a multiple of {cfg.grad_accum * world_size}")
    micro, seq_len, resets = cfg.micro_batch(world_size), cfg.data.seq_len, cfg.data.document_resets
    try:
        train = Batches(train_ds, micro, seq_len, seed=cfg.seed, rank=rank, world_size=world_size,
                        return_resets=resets)
    except DataError as e:
        raise DataError(f"data.seq_len: {e}") from None
    val: list = []
    if cfg.eval.every:
        val_ds = TokenDataset(data_dir, "val")
        try:
            vb = Batches(val_ds, micro, seq_len, seed=cfg.seed, rank=rank, world_size=world_size,
                         return_resets=resets)
        except DataError as e:
            raise DataError(f"data.seq_len: {e}; or raise data.val_fraction, or set eval.every=0 to train without "
                            "validation") from None
        val = [vb.batch(i) for i in range(cfg.eval.batches * cfg.grad_accum)]
    return TrainData(train=train, val=val, vocab_size=vocab, tokenizer=tok, directory=data_dir,
                     fingerprint=train_ds.fingerprint)




def check_training_memory(cfg: "TrainConfig", world_size: int = 1, device=None, where: str = "") -> None:
    """Refuse (ResourceError), before out_dir is touched, a training step that cannot fit in this process's memory:
    a lower bound of :mod:`linlm.models.memory` against what :mod:`linlm.resources` finds available on ``device``.
    ``where`` starts the message (a sweep names the run)."""
    from linlm.models.cost import STAND_IN_VOCAB
    from linlm.models.memory import training_floor
    from linlm.resources import check_memory

    micro = max(1, cfg.micro_batch(world_size))
    need = training_floor(cfg.model_config(vocab_size=STAND_IN_VOCAB), micro, cfg.data.seq_len)
    check_memory(need, f"{where}batch_size {cfg.batch_size} (micro-batches of {micro} x {cfg.data.seq_len} tokens) "
                       "with this model", "lower batch_size (or raise grad_accum), data.seq_len or the model's size",
                 device)
