"""Gated DeltaNet: the delta rule with Mamba-2's decay and an output gate (layers/gated_deltanet.py), SwiGLU,
RMSNorm.

The MLP is a dense SwiGLU of glu_dim, or with ``options.mlp_experts`` > 0 a top-k routed mixture of SwiGLU experts
(layers/moe.py), with an optional shared expert gated per token by a sigmoid: Qwen3-Next's sparse MLP, in every
layer (a hybrid's attention layers too).

Preset rule: on every paper-* row Gated DeltaNet keeps d, n_layers and n_heads (q and k 3/4 d, v and the gate
3/2 d: about 6 d^2 per mixer against LLaMA's 4 d^2) and gets the row's LLaMA non-embedding parameters by a
narrower GLU (``glu_matched_to_llama``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from linlm.layers.gated_deltanet import GatedDeltaNetMixer, head_k_dim
from linlm.layers.moe import MoEMLP
from linlm.models.archs.base import LINEAR_ATTENTION, ArchSpec, GLU_KNOB, glu_matched_to_llama, swiglu
from linlm.models.archs.deltanet import check_short_conv
from linlm.schema import config_error


MAX_EXPERTS = 4096


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
    # The MLP: 0 experts is a dense SwiGLU of glu_dim; E > 0 routes each token to mlp_top_k of E SwiGLU experts of
    # width mlp_expert_dim (0: glu_dim // mlp_top_k), renormalising the chosen softmax probabilities, plus a shared
    # expert of width shared_expert_dim (0: none), scaled per token by sigmoid(x w) with shared_expert_gate
    # (Qwen3-Next: num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size).
    mlp_experts: int = 0
    mlp_top_k: int = 2
    mlp_expert_dim: int = 0
    shared_expert_dim: int = 0
    shared_expert_gate: bool = False

    def validate(self) -> None:
        check_short_conv(self.short_conv)
        if not 0 <= self.mlp_experts <= MAX_EXPERTS:
            raise config_error("options.mlp_experts", f"must be 0 (a dense MLP) to {MAX_EXPERTS} experts, got "
                                                      f"{self.mlp_experts}")
        if self.mlp_experts and not 1 <= self.mlp_top_k <= self.mlp_experts:
            raise config_error("options.mlp_top_k", f"{self.mlp_top_k} is out of range; valid values are "
                                                    f"1..{self.mlp_experts} (mlp_experts)",
                               related=["options.mlp_experts"])
        for key in ("mlp_expert_dim", "shared_expert_dim"):
            if getattr(self, key) < 0:
                raise config_error(f"options.{key}", f"must be >= 0 (0: the default width), got {getattr(self, key)}")
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


def mlp(cfg, layer_idx: int) -> nn.Module:
    """A dense SwiGLU, or the routed mixture of experts ``options.mlp_experts`` asks for."""
    o = cfg.options
    if not o.mlp_experts:
        return swiglu(cfg, layer_idx)
    width = o.mlp_expert_dim or max(1, cfg.glu_hidden // o.mlp_top_k)
    return MoEMLP(cfg.d_model, o.mlp_experts, o.mlp_top_k, width, init_std=cfg.init_std,
                  shared_dim=o.shared_expert_dim, shared_gate=o.shared_expert_gate)


SPEC = ArchSpec("gated_deltanet", GatedDeltaNetMixer, mlp, "rms",
                "Gated DeltaNet: the delta rule with Mamba-2's decay and an output gate",
                family=LINEAR_ATTENTION, paper="arXiv 2412.06464", color="tab:cyan", scaling_study=True,
                extra_validate=validate, preset_rule=glu_matched_to_llama,
                size_knob=GLU_KNOB, options=GatedDeltaNetOptions)
