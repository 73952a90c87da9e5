"""MQAR, multi-query associative recall (Arora et al., Zoology, 2023): a synthetic test of how much a token mixer can
store in its state and retrieve on demand.

A sequence holds ``num_kv`` key-value pairs, then ``num_queries`` of those keys again, each followed by its value::

    k1 v1 k2 v2 ... kN vN | q1 a1 q2 a2 ... qM aM          (a_j is the value paired with key q_j)

With ``gap`` > 0, that many filler tokens (id 0) stand between the pairs and the queries: the same pairs recalled
across a longer context (the context-length study), with nothing new to store.

Keys are drawn without replacement from ids 1..K and values from K+1..V-1 (K = (V - 1) // 2; id 0 is never used),
uniformly and independently per sequence, so nothing can be memorised across sequences: the model must recall a_j
from the context. Only the answers are targets (``targets[t] = a_j`` at the position t of q_j, -100 elsewhere);
accuracy is the fraction of answers that are the argmax of the model's prediction (and the fraction of sequences
with every answer right).

With ``mix`` (pair counts below ``num_kv``), training batches cycle through those counts and then ``num_kv``, one
count per batch (``num_queries``, when given, capped at a batch's pairs), each sequence of fewer pairs padded at
its end with filler to ``seq_len`` (no targets there: a causal model answers before it sees them, and every batch
keeps one length, so tokens per step stay what the Trainer counts), while the validation and test sets hold
``num_kv`` pairs only. The easier sequences teach the lookup sooner: a loss
that sits at chance for thousands of steps on ``num_kv`` pairs alone can start to fall within hundreds.

A state of constant size holds only so many pairs: that is the point. The experiment that trains models of every
architecture on this task and reports accuracy against the width and the state's size is
:mod:`linlm.experiments.mqar` (``linlm mqar``); this module is the task alone.

Batches are a pure function of (seed, split, step, rank): :class:`MQARStream` resumes exactly from
``state_dict()``, and :func:`mqar_data` plugs it into the Trainer (``Trainer(cfg, data=mqar_data(mcfg))``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from linlm.errors import ConfigError, DataError

IGNORE = -100


@dataclass(frozen=True)
class MQARConfig:
    vocab_size: int = 128
    num_kv: int = 8
    num_queries: Optional[int] = None  # None: every key is queried once (num_queries = num_kv)
    gap: int = 0  # filler tokens (id 0) between the pairs and the queries
    mix: tuple[int, ...] = ()  # smaller pair counts training batches cycle through before num_kv's (module doc)

    @property
    def queries(self) -> int:
        return self.num_kv if self.num_queries is None else self.num_queries

    @property
    def num_keys(self) -> int:
        return (self.vocab_size - 1) // 2

    @property
    def chance(self) -> float:
        """The accuracy of guessing a value uniformly among the tokens that are not keys (nor the filler)."""
        return 1.0 / max(1, self.vocab_size - 1 - self.num_keys)

    @property
    def copy_loss(self) -> float:
        """The expected loss, on the test's sequences, of a model that has learned which tokens answer but not which
        answers which key: it predicts a value of the context in proportion to how often it occurs there. The
        queried pair's value occurs 1 + B times, B ~ Binomial(num_kv - 1, chance) (values are drawn independently),
        so the loss is E[ln(num_kv / (1 + B))]. MQAR's loss sits near this level before a model starts to retrieve,
        the second flat stretch after chance's."""
        n, p = self.num_kv, self.chance
        return sum(math.comb(n - 1, b) * p ** b * (1 - p) ** (n - 1 - b) * math.log(n / (1 + b)) for b in range(n))

    @property
    def seq_len(self) -> int:
        return 2 * (self.num_kv + self.queries) + self.gap

    def validate(self) -> "MQARConfig":
        if self.num_kv < 1:
            raise ConfigError(f"mqar num_kv: must be >= 1, got {self.num_kv}")
        if self.num_keys < self.num_kv:
            raise ConfigError(f"mqar vocab_size: {self.vocab_size} gives {self.num_keys} distinct keys, fewer than "
                              f"num_kv={self.num_kv}; use vocab_size >= {2 * self.num_kv + 1}")
        if not 0 <= self.gap <= 1_000_000:
            raise ConfigError(f"mqar gap: must be between 0 and 1000000 filler tokens, got {self.gap}")
        if self.num_queries is not None and not 1 <= self.num_queries <= self.num_kv:
            raise ConfigError(f"mqar num_queries: must be in 1..num_kv={self.num_kv} (or left out: every key), got "
                              f"{self.num_queries}")
        bad = [m for m in self.mix if not 1 <= m < self.num_kv]
        if bad:
            raise ConfigError(f"mqar mix: pair counts {bad} are not in 1..{self.num_kv - 1}; give counts below "
                              f"num_kv={self.num_kv} (the test's), or leave mix out")
        return self

    def at_step(self, step: int) -> "MQARConfig":
        """The task of training batch ``step``: with ``mix``, the pair counts taken in turn (then num_kv's)."""
        if not self.mix:
            return self
        counts = (*self.mix, self.num_kv)
        n = counts[step % len(counts)]
        queries = None if self.num_queries is None else min(self.num_queries, n)
        return MQARConfig(self.vocab_size, n, queries, self.gap)

    def fingerprint(self) -> str:
        """The task's identity, which seeds every batch. "Every key" is written as 0, as it was when 0 meant it, so
        that the streams (and the results drawn from them) stay those of earlier versions."""
        fields = asdict(self)
        if self.num_queries is None:
            fields["num_queries"] = 0
        if not self.gap:  # a task without a gap keeps the identity it had before the gap existed
            del fields["gap"]
        if self.mix:
            fields["mix"] = list(self.mix)
        else:  # and one without a mixture the identity it had before mixtures
            del fields["mix"]
        return hashlib.sha256(json.dumps({"mqar": fields}, sort_keys=True).encode()).hexdigest()[:16]


def pairs_text(task: dict) -> str:
    """How many pairs a task (``asdict`` of an MQARConfig, as results keep it) tests, and the training mixture."""
    n, mix = task["num_kv"], task.get("mix") or ()
    if not mix:
        return f"{n} pairs"
    return f"{n} pairs (trained on {', '.join(map(str, mix))} and {n} pairs in turn)"


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & ((1 << 63) - 1)


def mqar_batch(cfg: MQARConfig, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """ids, targets: LongTensor [batch, cfg.seq_len] (see the module doc)."""
    n, m, K = cfg.num_kv, cfg.queries, cfg.num_keys
    keys = torch.rand(batch, K, generator=generator).argsort(-1)[:, :n] + 1
    values = torch.randint(K + 1, cfg.vocab_size, (batch, n), generator=generator)
    pick = torch.rand(batch, n, generator=generator).argsort(-1)[:, :m]
    q_keys, q_values = keys.gather(1, pick), values.gather(1, pick)
    filler = torch.zeros(batch, cfg.gap, dtype=keys.dtype)
    ids = torch.cat([torch.stack([keys, values], -1).flatten(1), filler,
                     torch.stack([q_keys, q_values], -1).flatten(1)], 1)
    targets = torch.full_like(ids, IGNORE)
    targets[:, 2 * n + cfg.gap::2] = q_values
    return ids, targets


def _fixed_batch(cfg: MQARConfig, size: int, seed: int, split: str, index: int):
    """Batch ``index`` of a fixed set: its own generator, seeded by (seed, split, task, index)."""
    cfg = dataclasses.replace(cfg, mix=())  # held-out sets are num_kv's alone, the same with or without a mixture
    return mqar_batch(cfg, size, torch.Generator().manual_seed(_seed(seed, split, cfg.fingerprint(), index)))


def mqar_batches(cfg: MQARConfig, n_batches: int, batch: int, seed: int, split: str) -> list:
    """A fixed list of batches (validation or test sets), one generator per batch."""
    return [_fixed_batch(cfg, batch, seed, split, i) for i in range(n_batches)]


def mqar_test_set(cfg: MQARConfig, sequences: int, seed: int, batch: int = 64) -> list:
    """Exactly ``sequences`` held-out sequences, in batches of ``batch`` (the last one smaller when they do not
    divide): a multiple of ``batch`` gives the batches of ``mqar_batches(cfg, sequences // batch, batch, ...)``."""
    if sequences < 1:
        raise ConfigError(f"mqar test_sequences: must be >= 1, got {sequences}")
    return [_fixed_batch(cfg, min(batch, sequences - start), seed, "test", i)
            for i, start in enumerate(range(0, sequences, batch))]


class MQARStream:
    """An endless, resumable stream of training batches: batch ``step`` of process ``rank`` depends only on
    (seed, step, rank); ``state_dict()``/``load_state_dict()`` carry the position."""

    def __init__(self, cfg: MQARConfig, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1):
        self.cfg = cfg.validate()
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.step = 0

    def __iter__(self) -> "MQARStream":
        return self

    def batch(self, step: int):
        g = torch.Generator().manual_seed(_seed(self.seed, "train", self.cfg.fingerprint(), step, self.rank))
        ids, targets = mqar_batch(self.cfg.at_step(step), self.batch_size, g)
        pad = self.cfg.seq_len - ids.shape[1]
        if pad:
            ids = torch.nn.functional.pad(ids, (0, pad))
            targets = torch.nn.functional.pad(targets, (0, pad), value=IGNORE)
        return ids, targets

    def __next__(self):
        out = self.batch(self.step)
        self.step += 1
        return out

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.seed, "fingerprint": self.cfg.fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("fingerprint") != self.cfg.fingerprint() or state.get("seed") != self.seed:
            raise DataError("MQAR stream: the saved position belongs to another MQAR config or seed; resume with "
                            "the config the run started with")
        self.step = int(state["step"])


def mqar_data(cfg: MQARConfig, *, val_batches: int = 2, val_batch_size: int = 64, seed: int = 0):
    """The Trainer's ``data=`` factory: ``Trainer(train_cfg, data=mqar_data(MQARConfig(...)))``.

    The model's vocab_size comes from ``cfg.vocab_size``; train_cfg.data.seq_len is not used (sequences are
    ``cfg.seq_len`` long)."""
    cfg = cfg.validate()

    def factory(train_cfg, rank: int, world_size: int):
        from linlm.train import TrainData

        stream = MQARStream(cfg, train_cfg.micro_batch(world_size), seed=_seed(train_cfg.seed, seed) % (1 << 31),
                            rank=rank, world_size=world_size)
        return TrainData(train=stream, val=mqar_batches(cfg, val_batches, val_batch_size, seed, "val"),
                         vocab_size=cfg.vocab_size, tokenizer=None, directory=None,
                         fingerprint="mqar-" + cfg.fingerprint() + f"-seed{seed}")

    return factory


@torch.no_grad()
def mqar_accuracy(model, batches) -> dict:
    """Per-answer and per-sequence accuracy of greedy predictions on ``batches`` of (ids, targets)."""
    was_training = model.training
    model.eval()
    right = total = seq_right = seqs = 0
    try:
        for ids, targets in batches:
            ids, targets = ids.to(model.device), targets.to(model.device)
            pred = model(ids).argmax(-1)
            mask = targets != IGNORE
            ok = (pred == targets) & mask
            right += int(ok.sum())
            total += int(mask.sum())
            seq_right += int((ok.sum(1) == mask.sum(1)).sum())
            seqs += ids.shape[0]
    finally:
        model.train(was_training)
    return {"accuracy": right / max(total, 1), "sequence_accuracy": seq_right / max(seqs, 1), "answers": total}


def state_floats(model, seq_len: int) -> int:
    """Numbers held by the decoding state of one sequence after ``seq_len`` tokens (LLaMA: its KV cache)."""
    ids = torch.ones(1, seq_len, dtype=torch.long, device=model.device)
    with torch.no_grad():
        state = model(ids, return_state=True).state
    return sum(t.numel() for t in state.tensors())
