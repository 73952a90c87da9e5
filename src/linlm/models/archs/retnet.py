"""RetNet: multi-scale retention (layers/retnet.py), SwiGLU, RMSNorm (arXiv 2307.08621).

Preset rule: the value width is 2 d (expand_v = 2, the paper's), so retention holds 8 d^2 parameters per layer
where LLaMA's attention holds 4 d^2; as in the paper, the MLP gives them back. On every paper-* row the GLU width
is the multiple of 64 that brings a block closest to LLaMA's (counted on the meta device).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from linlm.layers.retnet import RetNetMixer
from linlm.models.archs.base import LINEAR_ATTENTION, ArchSpec, SizeKnob, glu_matched, swiglu
from linlm.schema import config_error

GLU_MULTIPLE = 64


@dataclass(frozen=True)
class RetNetOptions:
    expand_v: float = 2.0  # value width d * expand_v over all heads (the paper's 2 d)
    rope_theta: float = 10000.0  # base of the rotation of q and k

    def validate(self) -> None:
        for name in ("expand_v", "rope_theta"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise config_error(f"options.{name}", f"must be a positive finite number, got {value}")


def validate(cfg) -> None:
    width = cfg.d_model * cfg.options.expand_v
    if width != int(width) or int(width) % cfg.n_heads:
        raise config_error("options.expand_v", f"d_model * expand_v = {width} must be a whole multiple of "
                           f"n_heads={cfg.n_heads}; change expand_v, d_model or n_heads", related=("n_heads",))
    if cfg.head_dim % 2:
        raise config_error("d_model", f"d_model / n_heads = {cfg.head_dim} must be even for the rotation; change "
                           "d_model or n_heads", related=("n_heads",))


SPEC = ArchSpec("retnet", RetNetMixer, swiglu, "rms", "RetNet: multi-scale retention, a fixed decay per head",
                family=LINEAR_ATTENTION, paper="arXiv 2307.08621", color="teal", scaling_study=True, extra_validate=validate,
                preset_rule=glu_matched(GLU_MULTIPLE), size_knob=SizeKnob("glu_dim", GLU_MULTIPLE),
                options=RetNetOptions)
