"""The divergence guard: which steps are bad, when to stop, and advice a user can follow word for word.

A step is *bad* when its loss or gradient norm is not finite, or when the gradient is exactly zero while the loss
is finite (a saturated, dead network: nothing will move it again). A bad step's update is skipped, so the weights
stay those of the last good step; ``max_bad_steps`` bad steps in a row stop the run.

An update that *blows up the weights* stops the run at once: their global norm became non-finite or grew more
than ``WEIGHT_JUMP`` times in one step (with lr=1e3 and no clipping, AdamW moves every weight by about 1e3 in the
first step, and the loss then sits at ln(vocab) with a zero gradient). Such weights are never checkpointed.

Every checkpoint records the loss of its step, so the checkpoint named "last good" is one whose loss was finite.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Optional

from linlm.train import checkpoint as ckpt

WEIGHT_JUMP = 10.0


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


def last_good_checkpoint(root: Path) -> Optional[Path]:
    """The newest verified checkpoint under ``root`` whose step had a finite loss."""
    for _, path in reversed(ckpt.list_checkpoints(root)):
        state = ckpt.read_state(path)
        if state.get("sane", True) and (state.get("loss") is None or math.isfinite(state["loss"])):
            try:
                ckpt.verify(path)
            except Exception:  # noqa: BLE001 - a corrupt one is simply not good
                continue
            return path
    return None


def advice(cfg, out: Path, last_good: Optional[Path]) -> str:
    """The exact command that continues (or restarts) a diverged run with safer settings."""
    from linlm.train.config import OptimSection

    lr = min(cfg.optim.lr / 10, OptimSection().lr)
    sets = [f"--set optim.lr={lr:g}"]
    if cfg.optim.grad_clip == 0:
        sets.append("--set optim.grad_clip=1.0")
    config = shlex.quote(str(out / "config.yaml"))
    if last_good is not None:
        step = ckpt.read_state(last_good).get("step")
        new_out = shlex.quote(f"{out}-from-{step if step is not None else last_good.name}")
        command = (f"linlm train --config {config} --init-from {shlex.quote(str(last_good))} --out-dir {new_out} "
                   + " ".join(sets))
        return (f"the last good checkpoint is {last_good}. To continue from its weights with a lower learning rate "
                f"(a new run; optimizer and schedule start afresh), run: {command}")
    command = f"linlm train --config {config} --overwrite " + " ".join(sets)
    return f"no good checkpoint exists. To start over with a lower learning rate, run: {command}"
