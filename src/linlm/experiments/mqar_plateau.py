"""Training MQAR models to a plateau, and each architecture at its own learning rate.

**The plateau rule** (:class:`Plateau`). A run trains ``min_steps``, then ``block`` steps more at a time, up to
``max_steps``, at a constant learning rate after its warmup (so that a run continued is the run trained at once).
At each block boundary it has plateaued when the mean training loss of its last block is within ``tolerance``
(relative) of the block before's, or has fallen less than ``floor`` nats (a loss near zero cannot fall by a
fraction of itself). A run that reaches ``max_steps`` still falling has not plateaued, and says so: its accuracy
measures how fast it learns as much as what it can hold. The rule is checked only at block boundaries (multiples
of ``block`` from step 0), so a run stopped and resumed continues to the same steps as one that was not.

**Chance is not a plateau.** MQAR's loss first sits flat at chance (the entropy of a uniform guess among the values,
``-ln(chance)``) for hundreds to thousands of steps before it starts to fall, and the rule above would call that a
plateau. So a run whose loss (:func:`learning_loss`: its held-out loss at its last step, measured on the task's
pairs alone, or else the mean training loss over the last tenth of its steps) is not at least ``chance_margin`` nats
below chance has not plateaued (:func:`at_chance`). The held-out loss comes first because a training stream that
mixes in fewer pairs (``MQARConfig.mix``) can fall below chance on those alone. Such a run trains on to ``max_steps``, or
stops at ``chance_steps`` when the rule gives one, and says it did not plateau: it has not started learning, so its
accuracy says how slowly it starts, not what it can hold. The claims read the same test from the published rows.

**Copying is not a plateau either.** Next the loss sits near the level of a model that knows which tokens answer
but not which answers which key, and predicts a value of its context in proportion to how often it occurs there
(``MQARConfig.copy_loss``, about ln(num_kv)); a run can stay there for hundreds of steps and then fall, and the
rule above stopped such runs (a 2-layer LLaMA at 0.1 on 16 pairs, with its head tied to its embeddings). So a run
whose learning loss is not ``chance_margin`` nats below that level has not plateaued either (:func:`copying`): it
trains on to ``max_steps``, and its row says ``copying``. A state that holds nothing of the pairs would keep it
there to the end: the run then cannot tell a model that cannot recall from one that has not started, and says so.

**The learning rate** (:func:`choose_lr`): each configuration trains ``sweep_steps`` on seed 0 at each of a few
learning rates; the one with the lowest mean training loss over the last tenth of the steps is chosen (a diverged
run loses), and the table is recorded.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

from linlm.errors import ConfigError
from linlm.experiments.mqar_summary import loss_trend

CHANCE_MARGIN = 0.1  # nats below chance's loss a run's recent loss must reach to count as learning


def chance_loss(chance: float) -> float:
    """The loss of guessing uniformly among the answers, for an accuracy of ``chance`` (0 < chance <= 1)."""
    return -math.log(chance)


def recent_loss(losses: Sequence[Optional[float]]) -> Optional[float]:
    """The mean training loss of the last tenth of the steps (None with too few): the rows' ``loss_last_window``."""
    return loss_trend(losses)["loss_last_window"]


def learning_loss(records: Sequence[dict]) -> Optional[float]:
    """The loss the chance test reads: the held-out loss (``val_loss``) of the last record when it has one, else the
    recent training loss (:func:`recent_loss`)."""
    if records and records[-1].get("val_loss") is not None:
        return float(records[-1]["val_loss"])
    return recent_loss([r.get("loss") for r in records])


def _not_below(loss: Optional[float], level: float, margin: float) -> bool:
    """Whether ``loss`` is not ``margin`` nats below ``level`` (an unknown or non-finite loss is not)."""
    return loss is None or not math.isfinite(loss) or loss > level - margin


def at_chance(loss: Optional[float], chance: float, margin: float = CHANCE_MARGIN) -> bool:
    """Whether a run whose recent loss is ``loss`` has not yet left chance: its loss is not ``margin`` nats below
    the loss of a uniform guess (an unknown loss counts as at chance)."""
    return _not_below(loss, chance_loss(chance), margin)


def copying(loss: Optional[float], copy_loss: float, margin: float = CHANCE_MARGIN) -> bool:
    """Whether a run whose learning loss is ``loss`` does no better than copying a value of its context: its loss is
    not ``margin`` nats below ``copy_loss`` (an unknown loss counts as copying)."""
    return _not_below(loss, copy_loss, margin)


@dataclass(frozen=True)
class Plateau:
    block: int = 200
    min_steps: int = 400
    max_steps: int = 1200
    tolerance: float = 0.02
    floor: float = 0.01
    chance_margin: float = CHANCE_MARGIN
    chance_steps: Optional[int] = None  # a run still at chance here stops, not plateaued (None: on to max_steps)

    def validate(self) -> "Plateau":
        if self.block < 1 or self.min_steps < 2 * self.block or self.min_steps % self.block:
            raise ConfigError(f"plateau: block {self.block}, min_steps {self.min_steps}; give min_steps a multiple "
                              "of block, at least two blocks (the rule compares the last block with the one before)")
        if self.max_steps < self.min_steps:
            raise ConfigError(f"plateau: max_steps {self.max_steps} is below min_steps {self.min_steps}")
        if not 0 < self.tolerance < 1 or self.floor < 0:
            raise ConfigError(f"plateau: tolerance {self.tolerance} (a fraction in (0, 1)), floor {self.floor} (nats "
                              ">= 0)")
        if not 0 <= self.chance_margin <= 10:
            raise ConfigError(f"plateau: chance_margin {self.chance_margin} (nats below chance's loss, in [0, 10])")
        c = self.chance_steps
        if c is not None and (c % self.block or not self.min_steps <= c <= self.max_steps):
            raise ConfigError(f"plateau: chance_steps {c}; give a multiple of block {self.block} between min_steps "
                              f"{self.min_steps} and max_steps {self.max_steps}, or leave it out")
        return self

    def text(self) -> str:
        return (f"trained in blocks of {self.block} steps from {self.min_steps} to at most {self.max_steps}; "
                f"plateaued when the last block's mean training loss is within {self.tolerance:.0%} (or "
                f"{self.floor:g} nats) of the block before's, and its held-out loss is {self.chance_margin:g} "
                f"nats or more below chance's and below copying a value of the context"
                + ("" if self.chance_steps is None else
                   f"; a run still at chance at {self.chance_steps} steps stops there"))

    def next_steps(self, step: int) -> int:
        """The step to train to next from ``step``: the next block boundary, at most max_steps."""
        return min(self.max_steps, max(self.min_steps, (step // self.block + 1) * self.block))

    def plateaued(self, records: Sequence[dict], chance: Optional[float] = None,
                  copy_loss: Optional[float] = None) -> Optional[bool]:
        """Whether the run whose metrics are ``records`` (step, loss) has plateaued at its last step: None when its
        last step is not a block boundary past min_steps (not decided there). With the task's ``chance`` accuracy,
        a run still at chance has not plateaued; with its ``copy_loss``, nor has a run still copying."""
        if not records:
            return None
        step = int(records[-1]["step"])
        if step < self.min_steps or step % self.block:
            return None
        loss = learning_loss(records)
        if chance is not None and at_chance(loss, chance, self.chance_margin):
            return False
        if copy_loss is not None and copying(loss, copy_loss, self.chance_margin):
            return False
        last = [r["loss"] for r in records if step - self.block < r["step"] <= step and r.get("loss") is not None]
        prev = [r["loss"] for r in records
                if step - 2 * self.block < r["step"] <= step - self.block and r.get("loss") is not None]
        if not last or not prev:
            return None
        a, b = statistics.fmean(prev), statistics.fmean(last)
        return a - b <= max(self.tolerance * abs(a), self.floor)


    def gives_up(self, records: Sequence[dict], chance: float) -> bool:
        """Whether the run stops here still at chance: at or past ``chance_steps`` (when the rule gives one)."""
        if self.chance_steps is None or not records or int(records[-1]["step"]) < self.chance_steps:
            return False
        return at_chance(learning_loss(records), chance, self.chance_margin)


def choose_lr(rows: Sequence[dict]) -> dict:
    """{"losses": {lr: mean training loss of the last window, or None when diverged}, "chosen": lr} from the
    sweep rows of one configuration (each with its ``lr``)."""
    losses = {r["lr"]: (None if r.get("diverged") else r.get("loss_last_window")) for r in rows}
    ranked = sorted(losses, key=lambda lr: float("inf") if losses[lr] is None else losses[lr])
    return {"losses": {f"{lr:g}": v for lr, v in losses.items()}, "chosen": ranked[0]}
