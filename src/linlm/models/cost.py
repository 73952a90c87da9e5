"""The cost model: the two FLOP counts linlm keeps apart, and the FLOPs that training spends.

Two numbers are called "training FLOPs per token" in this field, and linlm gives them different names:

- **paper FLOPs per token** (``paper_flops_per_token``): the closed-form formula an architecture's paper gives
  (``ArchSpec.paper_flops``) at batch b and length n, over b x n tokens. It is what C means in the scaling fits
  and in every PFLOP/s-days figure: embeddings and the LM head are left out. An architecture without a formula
  (Mamba, MossNet) falls back to the counted FLOPs, so C is defined for every architecture.
- **counted FLOPs per token** (``counted_flops_per_token``): 3 x the forward FLOPs (forward plus backward) walked
  from the module shapes (:func:`linlm.models.counting.count`). What the body of a step really computes: the
  trainer's MFU and the FLOP-rate time estimates use it.

Neither includes the LM head; its FLOPs per token (``lm_head_flops_per_token`` of a count, ``head_flops_per_token``
of a planned run) are spent by every step, so :func:`training_flops` adds them to whichever body count it is given.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from linlm.models.model_config import ModelConfig

# The vocabulary of a model counted before its tokenizer is known (a ladder is planned before the data is
# prepared). The non-embedding counts and the paper FLOPs do not depend on it; the LM head's FLOPs do.
STAND_IN_VOCAB = 256


def training_flops(tokens: float, flops_per_token: float, head_flops_per_token: float) -> float:
    """FLOPs spent training ``tokens`` tokens: the body's FLOPs per token (paper or counted, as the caller's
    figure is) plus the LM head's, which C leaves out but every step computes."""
    return float(tokens * (flops_per_token + head_flops_per_token))


def paper_flops_per_token(counts: dict) -> float:
    """The paper FLOPs per token of a :func:`~linlm.models.counting.count`: its FLOPs per step over its tokens."""
    return counts["flops_per_step"] / (counts["batch"] * counts["seq_len"])


@dataclass(frozen=True)
class PlanCost:
    """What a planned run costs, counted with the stand-in vocabulary."""

    params: int  # non-embedding (active) parameters N
    paper_flops_per_token: float  # C per token: the paper convention (embeddings and LM head excluded)
    head_flops_per_token: float  # training FLOPs per token of the LM head, at the stand-in vocabulary


_PLANNED: dict[str, PlanCost] = {}


def plan_cost(model_config: Callable[..., ModelConfig], batch: int, seq_len: int) -> PlanCost:
    """The cost of training the model ``model_config(vocab_size=...)`` builds at ``batch`` x ``seq_len`` tokens a
    step, counted before the tokenizer is known: ``STAND_IN_VOCAB`` fills in a vocabulary the model does not set.

    Counted once per model shape in a process: planning the paper ladder builds 27 models of up to 7B parameters
    on the meta device (about 0.3 s each), and a command plans its runs several times (its checks before any
    work, then the work). This module imports torch only here, so that planning code can import it cheaply."""
    from linlm.models.counting import count

    cfg = model_config(vocab_size=STAND_IN_VOCAB)
    key = json.dumps([dataclasses.asdict(cfg), batch, seq_len], sort_keys=True, default=str)
    if key not in _PLANNED:
        counted = count(cfg, batch=batch, seq_len=seq_len)
        _PLANNED[key] = PlanCost(params=int(counted["active_non_embedding_params"]),
                                 paper_flops_per_token=paper_flops_per_token(counted),
                                 head_flops_per_token=counted["lm_head_flops_per_token"])
    return _PLANNED[key]
