"""HGRN2: gated linear attention with a data-dependent vector gate and a learned lower bound per layer.

The options default to the paper's model; the others are the variants of flash-linear-attention's HGRN2 (its
checkpoints convert with them set: linlm.conversion.fla_hgrn2).
"""

from __future__ import annotations

from dataclasses import dataclass

from linlm.errors import choices_text
from linlm.layers.glu import GLU
from linlm.layers.hgrn2 import HGRN2Mixer, lower_bounds
from linlm.models.archs.base import LINEAR_ATTENTION, ArchSpec, paper_base_flops
from linlm.schema import config_error

MLP_ACTIVATIONS = {"none": None, "silu": "silu"}


def paper_flops(cfg, b, n):
    """72 b n l d^2 (1 + 1/(3h) + 29/(72d))."""
    d, h = cfg.d_model, cfg.n_heads
    return paper_base_flops(cfg, b, n) * (1 + 1 / (3 * h) + 29 / (72 * d))


@dataclass(frozen=True)
class HGRN2Options:
    # The learned lower bound on the forget gate (fla: use_lower_bound); False: every gate is sigmoid(x W_f).
    lower_bound: bool = True
    # q times head_dim^-1/2 before the recurrence, as fla's GLA kernels do by default.
    q_scale: bool = False
    # A weight on the RMSNorm before the output projection (fla: elementwise_affine).
    out_norm_weight: bool = False
    # Kernel size of causal depthwise convolutions after the q, f and v projections (fla: use_short_conv,
    # conv_size; no bias, no activation); 0: none.
    short_conv: int = 0
    # The GLU's activation: "none" is the paper's SGLU, "silu" SwiGLU (fla's GatedMLP).
    mlp_act: str = "none"

    def validate(self) -> None:
        if self.mlp_act not in MLP_ACTIVATIONS:
            raise config_error("options.mlp_act", f"unknown activation {self.mlp_act!r}; valid choices are "
                                                  f"{choices_text(MLP_ACTIVATIONS)}")
        if self.short_conv < 0:
            raise config_error("options.short_conv", f"must be >= 0 (0: no convolution), got {self.short_conv}")


def glu(cfg, layer_idx: int):
    return GLU(cfg.d_model, cfg.glu_hidden, activation=MLP_ACTIVATIONS[cfg.options.mlp_act])


SPEC = ArchSpec("hgrn2", HGRN2Mixer, glu, "srms", "HGRN2: gated linear attention with a data-dependent vector gate",
                family=LINEAR_ATTENTION, paper="arXiv 2404.07904", color="tab:green", scaling_study=True,
                paper_flops=paper_flops, shared=lower_bounds, options=HGRN2Options)
