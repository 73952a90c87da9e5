"""GLA: gated linear attention with a low-rank vector forget gate (layers/gla.py), SwiGLU, RMSNorm
(arXiv 2312.06635).

At expand_k = 1/2 and expand_v = 1 a layer's projections hold 4 d^2 parameters, LLaMA's attention's; the gate adds
(d + d/2) r + d/2. So the paper-* rows keep LLaMA's shape: the non-embedding counts differ by the gates alone
(tests/models/test_family.py checks the 2 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from linlm.models.archs.base import LINEAR_ATTENTION, ArchSpec, positive_ints, swiglu
from linlm.layers.gla import GLAMixer
from linlm.schema import config_error


@dataclass(frozen=True)
class GLAOptions:
    expand_k: float = 0.5  # key width d * expand_k over all heads (the paper's d_k = d / 2)
    expand_v: float = 1.0  # value width d * expand_v over all heads
    gate_rank: int = 16  # rank of the forget gate's projection
    gate_tau: float = 16.0  # the gate's temperature: log a = logsigmoid(.) / tau

    def validate(self) -> None:
        positive_ints(self, "gate_rank")
        for name in ("expand_k", "expand_v", "gate_tau"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise config_error(f"options.{name}", f"must be a positive finite number, got {value}")


def validate(cfg) -> None:
    o = cfg.options
    for name in ("expand_k", "expand_v"):
        width = cfg.d_model * getattr(o, name)
        if width != int(width) or int(width) % cfg.n_heads:
            raise config_error(f"options.{name}", f"d_model * {name} = {width} must be a whole multiple of "
                               f"n_heads={cfg.n_heads}; change {name}, d_model or n_heads", related=("n_heads",))


SPEC = ArchSpec("gla", GLAMixer, swiglu, "rms", "GLA: gated linear attention with a low-rank vector forget gate",
                family=LINEAR_ATTENTION, paper="arXiv 2312.06635", color="tab:olive", scaling_study=True, extra_validate=validate,
                options=GLAOptions)
