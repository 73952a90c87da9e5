"""Gated DeltaNet: the delta rule with Mamba-2's decay and an output gate (layers/gated_deltanet.py), SwiGLU,
RMSNorm.

Preset rule: on every paper-* row Gated DeltaNet keeps d, n_layers and n_heads (q and k 3/4 d, v and the gate
3/2 d: about 6 d^2 per mixer against LLaMA's 4 d^2) and gets the row's LLaMA non-embedding parameters by a
narrower GLU (``glu_matched_to_llama``).
"""

from __future__ import annotations

from dataclasses import dataclass

from linlm.layers.gated_deltanet import GatedDeltaNetMixer, head_k_dim
from linlm.models.archs.base import LINEAR_ATTENTION, ArchSpec, glu_matched_to_llama, swiglu
from linlm.models.archs.deltanet import check_short_conv
from linlm.schema import config_error


@dataclass(frozen=True)
class GatedDeltaNetOptions:
    # Key width per head (fla: head_dim); 0: 3/4 d_model / n_heads.
    head_k_dim: int = 0
    # Value width per head over key width (fla: expand_v); head_k_dim * expand_v must be a whole number.
    expand_v: float = 2.0
    # Kernel size of the causal depthwise convolution over q, k and v (fla: conv_size; no bias); 0: none (SiLU only).
    short_conv: int = 4
    # beta = 2 sigmoid(.) in (0, 2) (fla: allow_neg_eigval, arXiv 2411.12537).
    neg_eigval: bool = False
    # Value heads (fla: num_v_heads; Qwen3-Next: linear_num_value_heads), a multiple of n_heads, the q/k heads;
    # 0: n_heads. Value head h reads q and k head h // (v_heads / n_heads).
    v_heads: int = 0

    def validate(self) -> None:
        check_short_conv(self.short_conv)
        if self.head_k_dim < 0:
            raise config_error("options.head_k_dim", f"must be >= 0 (0: 3/4 d_model / n_heads), got "
                                                     f"{self.head_k_dim}")
        if not self.expand_v > 0:
            raise config_error("options.expand_v", f"must be > 0, got {self.expand_v}")
        if self.v_heads < 0:
            raise config_error("options.v_heads", f"must be >= 0 (0: n_heads), got {self.v_heads}")


def validate(cfg) -> None:
    if cfg.options.v_heads % cfg.n_heads:
        raise config_error("options.v_heads", f"{cfg.options.v_heads} value heads is not a multiple of n_heads="
                                              f"{cfg.n_heads} (the q/k heads); choose a multiple, or 0",
                           related=["n_heads"])
    v = head_k_dim(cfg) * cfg.options.expand_v
    if v < 1 or abs(v - round(v)) > 1e-9:
        raise config_error("options.expand_v", f"head_k_dim x expand_v = {head_k_dim(cfg)} x {cfg.options.expand_v} "
                                               f"= {v:g} must be a whole number of at least 1; choose expand_v so "
                                               f"that it is", related=["options.head_k_dim"])


SPEC = ArchSpec("gated_deltanet", GatedDeltaNetMixer, swiglu, "rms",
                "Gated DeltaNet: the delta rule with Mamba-2's decay and an output gate",
                family=LINEAR_ATTENTION, paper="arXiv 2412.06464", color="tab:cyan", scaling_study=True,
                extra_validate=validate, preset_rule=glu_matched_to_llama, options=GatedDeltaNetOptions)
