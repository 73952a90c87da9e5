"""The divergence guard: which steps are bad, when to stop, and advice a user can follow word for word.

A step is *bad* when its loss or gradient norm is not finite, or when the gradient is exactly zero while the loss
is finite (a saturated, dead network: nothing will move it again). A bad step's update is skipped, so the weights
stay those of the last good step; ``max_bad_steps`` bad steps in a row stop the run.

An update that *blows up the weights* stops the run at once: their global norm became non-finite or grew more
than ``WEIGHT_JUMP`` times in one step (with lr=1e3 and no clipping, AdamW moves every weight by about 1e3 in the
first step, and the loss then sits at ln(vocab) with a zero gradient). Such weights are never checkpointed.

A *slow divergence* keeps every number finite and every update small, and the loss climbs anyway (the demo at
lr=3 went from 7.65 to 275 nats/token in 60 steps). :class:`LossWatch` stops it in two ways:

- **Far above a uniform guess.** A model that gives every one of its V tokens the same probability has a loss of
  ln V; a fresh model starts there (the demo's first step: 7.65 against ln 2048 = 7.62) and training only lowers
  it. A loss above ``2 ln V`` (and at least ``ln V + MIN_MARGIN``, for small vocabularies) means the right token
  gets, on the geometric mean, less than 1/V of the uniform probability: the model is confidently wrong, which
  only weights gone bad produce. The demo at lr=3 passes it at step 4 (17.9 > 15.2).
- **Still rising.** The losses of good steps are averaged in blocks of ``RISE_BLOCK`` steps (ten steps smooth
  out the step-to-step noise: about 0.1 nats on the demo's plateau). The run has diverged when the last
  ``RISE_BLOCKS`` block means rose one after the other and the newest is ``RISE_NATS`` (a factor e in perplexity)
  above the lowest block mean of the run. The first steps and warmup cannot trip it: there the loss falls from
  ln V, and a healthy run's bumps (a loss that rises for a few steps as the learning rate grows) are a fraction
  of a nat and do not last thirty steps.

The watch's state goes into every checkpoint, so a resumed run stops where the uninterrupted one would have.

Every checkpoint records the loss of its step, so the checkpoint named "last good" is one whose loss was finite
and, for the watch, within ``RISE_NATS`` of the lowest block mean seen.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Optional

from linlm.train import checkpoint as ckpt

WEIGHT_JUMP = 10.0
MIN_MARGIN = 3.0  # nats: the least a loss may exceed ln V by before it counts as far above a uniform guess
RISE_BLOCK = 10  # steps averaged into one block mean
RISE_BLOCKS = 3  # consecutive block means that must rise
RISE_NATS = 1.0  # how far the newest block mean must be above the lowest one


def bad_step(loss: float, grad_norm: float) -> Optional[str]:
    """Why this step's update must be skipped, or None."""
    if not math.isfinite(loss):
        return "non-finite loss"
    if not math.isfinite(grad_norm):
        return "non-finite gradient"
    if grad_norm == 0.0:
        return "zero gradient"
    return None


def exploded(before: float, after: float) -> Optional[str]:
    """Why the weights after an update are unusable, or None."""
    if not math.isfinite(after):
        return "the weights became non-finite"
    if before > 0 and after > WEIGHT_JUMP * before:
        return f"the update grew the weights' norm from {before:.3g} to {after:.3g}"
    return None


def loss_ceiling(vocab_size: int) -> float:
    """The loss above which a model is far worse than a uniform guess: 2 ln V, at least ln V + MIN_MARGIN."""
    uniform = math.log(vocab_size)
    return uniform + max(uniform, MIN_MARGIN)


class LossWatch:
    """Watches the loss of the good steps for a slow divergence (see the module doc); deterministic, so every
    process of a distributed run, given the same all-reduced losses, decides alike."""

    def __init__(self, vocab_size: int, state: Optional[dict] = None):
        self.uniform = math.log(vocab_size)
        self.ceiling = loss_ceiling(vocab_size)
        state = state or {}
        self.blocks: list[float] = [float(m) for m in state.get("blocks", [])][-RISE_BLOCKS:]  # newest last
        self.filling: list[float] = [float(x) for x in state.get("filling", [])]  # the block being filled
        self.lowest: Optional[float] = state.get("lowest")

    def state_dict(self) -> dict:
        return {"blocks": self.blocks, "filling": self.filling, "lowest": self.lowest}

    def check(self, loss: float) -> Optional[str]:
        """Record the (finite) loss of a good step; return why the run has diverged, or None."""
        if loss > self.ceiling:
            return (f"the loss {loss:.4g} nats/token passed {self.ceiling:.3g}, far above the {self.uniform:.3g} of "
                    "a uniform guess over the vocabulary")
        self.filling.append(loss)
        if len(self.filling) < RISE_BLOCK:
            return None
        mean = sum(self.filling) / len(self.filling)
        self.filling = []
        self.blocks = (self.blocks + [mean])[-RISE_BLOCKS:]
        lowest = mean if self.lowest is None else min(self.lowest, mean)
        self.lowest = lowest
        rising = len(self.blocks) == RISE_BLOCKS and all(a < b for a, b in zip(self.blocks, self.blocks[1:]))
        if rising and mean >= lowest + RISE_NATS:
            means = ", ".join(f"{m:.3g}" for m in self.blocks)
            return (f"the loss kept rising for {RISE_BLOCK * RISE_BLOCKS} steps, to {mean - lowest:.2g} nats above "
                    f"its lowest: means of {RISE_BLOCK} steps {means} after {lowest:.3g}")
        return None

    def good_loss(self) -> float:
        """The highest loss a checkpoint's step may have had for the checkpoint to count as good."""
        return (self.lowest if self.lowest is not None else self.uniform) + RISE_NATS


class Guard:
    """The per-step decision of a run, from the numbers a step produces and nothing else (no model, no data): a bad
    step (see :func:`bad_step`) is skipped and ``max_bad_steps`` of them in a row stop the run; a good step stops it
    when the update blew up the weights (:func:`exploded`) or the loss watch sees a divergence (:class:`LossWatch`).
    The trainer feeds it every step; the tests feed it loss sequences built for each rule."""

    def __init__(self, watch: LossWatch, max_bad_steps: int, weight_norm: float):
        self.watch = watch  # its state is the checkpoint's; the streak starts afresh with each process
        self.max_bad_steps = max_bad_steps
        self.weight_norm = weight_norm  # the weights' global norm after the last good update
        self.streak = 0  # bad steps in a row

    def good(self, loss: float, weight_norm: float) -> Optional[str]:
        """Record a good step (its loss and the weights' norm after its update); return why the run must stop now,
        or None."""
        self.streak = 0
        before, self.weight_norm = self.weight_norm, weight_norm
        return exploded(before, weight_norm) or self.watch.check(loss)

    def bad(self, why: str) -> Optional[str]:
        """Record a skipped step and why it was bad; return why the run must stop now, or None."""
        self.streak += 1
        if self.streak >= self.max_bad_steps:
            return f"{self.streak} steps in a row were bad ({why}; max_bad_steps={self.max_bad_steps})"
        return None


def last_good_checkpoint(root: Path, max_loss: Optional[float] = None) -> Optional[Path]:
    """The newest verified checkpoint under ``root`` whose step had a finite loss (at most ``max_loss``)."""
    for _, path in reversed(ckpt.list_checkpoints(root)):
        state = ckpt.read_state(path)
        loss = state.get("loss")
        if not state.get("sane", True) or (loss is not None and not math.isfinite(loss)):
            continue
        if max_loss is not None and loss is not None and loss > max_loss:
            continue
        try:
            ckpt.verify(path, model_only_ok=True)  # the advice starts a new run from its weights: model-only will do
        except Exception:  # noqa: BLE001 - a corrupt one is simply not good
            continue
        return path
    return None


def advice(cfg, out: Path, last_good: Optional[Path]) -> str:
    """The exact command that continues (or restarts) a diverged run with safer settings."""
    from linlm.train.train_config import OptimSection

    lr = min(cfg.optim.lr / 10, OptimSection().lr)
    sets = [f"--set optim.lr={lr:g}"]
    if cfg.optim.grad_clip == 0:
        sets.append("--set optim.grad_clip=1.0")
    config = shlex.quote(str(out / "config.yaml"))
    if last_good is not None:
        step = ckpt.read_state(last_good).get("step")
        new_out = shlex.quote(f"{out}-from-{step if step is not None else last_good.name}")
        command = (f"linlm train --config {config} --init-from {shlex.quote(str(last_good))} --out {new_out} "
                   + " ".join(sets))
        return (f"the last good checkpoint is {last_good}. To continue from its weights with a lower learning rate "
                f"(a new run; optimizer and schedule start afresh), run: {command}")
    command = f"linlm train --config {config} --overwrite " + " ".join(sets)
    return f"no good checkpoint exists. To start over with a lower learning rate, run: {command}"
