"""Training MQAR models to a plateau, and each architecture at its own learning rate.

**The plateau rule** (:class:`Plateau`). A run trains ``min_steps``, then ``block`` steps more at a time, up to
``max_steps``, at a constant learning rate after its warmup (so that a run continued is the run trained at once).
At each block boundary it has plateaued when the mean training loss of its last block is within ``tolerance``
(relative) of the block before's, or has fallen less than ``floor`` nats (a loss near zero cannot fall by a
fraction of itself). A run that reaches ``max_steps`` still falling has not plateaued, and says so: its accuracy
measures how fast it learns as much as what it can hold. The rule is checked only at block boundaries (multiples
of ``block`` from step 0), so a run stopped and resumed continues to the same steps as one that was not.

**The learning rate** (:func:`choose_lr`): each configuration trains ``sweep_steps`` on seed 0 at each of a few
learning rates; the one with the lowest mean training loss over the last tenth of the steps is chosen (a diverged
run loses), and the table is recorded.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

from linlm.errors import ConfigError


@dataclass(frozen=True)
class Plateau:
    block: int = 200
    min_steps: int = 400
    max_steps: int = 1200
    tolerance: float = 0.02
    floor: float = 0.01

    def validate(self) -> "Plateau":
        if self.block < 1 or self.min_steps < 2 * self.block or self.min_steps % self.block:
            raise ConfigError(f"plateau: block {self.block}, min_steps {self.min_steps}; give min_steps a multiple "
                              "of block, at least two blocks (the rule compares the last block with the one before)")
        if self.max_steps < self.min_steps:
            raise ConfigError(f"plateau: max_steps {self.max_steps} is below min_steps {self.min_steps}")
        if not 0 < self.tolerance < 1 or self.floor < 0:
            raise ConfigError(f"plateau: tolerance {self.tolerance} (a fraction in (0, 1)), floor {self.floor} (nats "
                              ">= 0)")
        return self

    def text(self) -> str:
        return (f"trained in blocks of {self.block} steps from {self.min_steps} to at most {self.max_steps}; "
                f"plateaued when the last block's mean training loss is within {self.tolerance:.0%} (or "
                f"{self.floor:g} nats) of the block before's")

    def next_steps(self, step: int) -> int:
        """The step to train to next from ``step``: the next block boundary, at most max_steps."""
        return min(self.max_steps, max(self.min_steps, (step // self.block + 1) * self.block))

    def plateaued(self, records: Sequence[dict]) -> Optional[bool]:
        """Whether the run whose metrics are ``records`` (step, loss) has plateaued at its last step: None when its
        last step is not a block boundary past min_steps (not decided there)."""
        if not records:
            return None
        step = int(records[-1]["step"])
        if step < self.min_steps or step % self.block:
            return None
        last = [r["loss"] for r in records if step - self.block < r["step"] <= step and r.get("loss") is not None]
        prev = [r["loss"] for r in records
                if step - 2 * self.block < r["step"] <= step - self.block and r.get("loss") is not None]
        if not last or not prev:
            return None
        a, b = statistics.fmean(prev), statistics.fmean(last)
        return a - b <= max(self.tolerance * abs(a), self.floor)


def choose_lr(rows: Sequence[dict]) -> dict:
    """{"losses": {lr: mean training loss of the last window, or None when diverged}, "chosen": lr} from the
    sweep rows of one configuration (each with its ``lr``)."""
    losses = {r["lr"]: (None if r.get("diverged") else r.get("loss_last_window")) for r in rows}
    ranked = sorted(losses, key=lambda lr: float("inf") if losses[lr] is None else losses[lr])
    return {"losses": {f"{lr:g}": v for lr, v in losses.items()}, "chosen": ranked[0]}
