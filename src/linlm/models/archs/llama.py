"""LLaMA: softmax attention with RoPE, SwiGLU and RMSNorm; decodes with a KV cache.

Its options are the layouts of real checkpoints (Llama 2 and 3): grouped-query attention and RoPE's base and
scaling. An architecture with attention layers of its own (a hybrid) reuses them by deriving its options from
LlamaOptions: layers/attention.py reads these fields from ``cfg.options``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from linlm.errors import ConfigError, choices_text
from linlm.layers.attention import ROPE_SCALINGS, Attention, rotary_dims
from linlm.models.archs.base import BASELINE, ArchSpec, own_names, paper_base_flops, swiglu
from linlm.schema import config_error


def paper_flops(cfg, b, n):
    """72 b n l d^2 (1 + n/(6d) + 5/(18d))."""
    d = cfg.d_model
    return paper_base_flops(cfg, b, n) * (1 + n / (6 * d) + 5 / (18 * d))


@dataclass(frozen=True)
class LlamaOptions:
    rope_theta: float = 10000.0
    # n_kv_heads < n_heads is grouped-query attention (0 means n_heads).
    n_kv_heads: int = 0
    # RoPE frequency scaling: "none", or "llama3" (Llama 3.1's smooth long-context rescaling, with these parameters).
    rope_scaling: str = "none"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    # Variants of the attention layer that later checkpoints use (Qwen3-Next's attention uses all four; each is
    # off by default, LLaMA's own layer): the width of each head (0: d_model / n_heads), an RMSNorm with a weight
    # over each head of q and k before RoPE, a sigmoid gate on each head's output computed from x (the q
    # projection's second half), and RoPE on the first rope_fraction of each head's channels only.
    head_dim: int = 0
    qk_norm: bool = False
    output_gate: bool = False
    rope_fraction: float = 1.0

    def validate(self) -> None:
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise config_error("options.rope_theta", f"must be a positive finite number, got {self.rope_theta}")
        if self.head_dim < 0:
            raise config_error("options.head_dim", f"must be >= 0 (0: d_model / n_heads), got {self.head_dim}")
        if not (math.isfinite(self.rope_fraction) and 0 < self.rope_fraction <= 1):
            raise config_error("options.rope_fraction", f"must be in (0, 1] (the share of each head's channels "
                                                        f"RoPE turns), got {self.rope_fraction}")
        if self.rope_scaling not in ROPE_SCALINGS:
            raise config_error("options.rope_scaling", f"unknown scaling {self.rope_scaling!r}; valid choices are "
                                                       f"{choices_text(ROPE_SCALINGS)}")
        if self.rope_scaling == "llama3" and not (
            self.rope_factor >= 1 and 0 < self.rope_low_freq_factor < self.rope_high_freq_factor
            and self.rope_original_max_len > 0
        ):
            raise config_error(
                "options.rope_factor", "llama3 scaling needs factor >= 1, 0 < low < high and a positive original "
                f"length, got rope_factor={self.rope_factor}, rope_low_freq_factor={self.rope_low_freq_factor}, "
                f"rope_high_freq_factor={self.rope_high_freq_factor}, "
                f"rope_original_max_len={self.rope_original_max_len}",
                related=("options.rope_low_freq_factor", "options.rope_high_freq_factor",
                         "options.rope_original_max_len", "options.rope_scaling"))


def validate(cfg) -> None:
    o = cfg.options
    if o.head_dim == 0 and cfg.head_dim % 2:
        raise ConfigError(
            f"d_model / n_heads = {cfg.head_dim} must be even for rotary embeddings; change d_model or n_heads"
        )
    rot = rotary_dims(o.head_dim or cfg.head_dim, o.rope_fraction)
    if rot < 2 or rot % 2:
        raise config_error("options.rope_fraction", f"turns {rot} of each head's {o.head_dim or cfg.head_dim} "
                                                    "channels; RoPE needs an even number of at least 2",
                           related=("options.head_dim",))
    n_kv = cfg.options.n_kv_heads
    if n_kv < 0 or cfg.n_heads % cfg.kv_heads:
        raise config_error("options.n_kv_heads", f"{n_kv} must divide n_heads={cfg.n_heads} (0 means n_heads); "
                           f"choose among {[h for h in range(1, cfg.n_heads + 1) if cfg.n_heads % h == 0]}",
                           related=("n_heads",))


# The earlier flat spellings (n_kv_heads=2, ...); the later options are read under ``options`` only (a flat
# ``head_dim`` would be taken for Mamba-2's option of that name).
FLAT = {k: v for k, v in own_names(LlamaOptions).items()
        if k not in ("head_dim", "qk_norm", "output_gate", "rope_fraction")}

SPEC = ArchSpec("llama", Attention, swiglu, "rms", "LLaMA: softmax attention with RoPE, SwiGLU, RMSNorm",
                family=BASELINE, paper="arXiv 2302.13971", color="tab:blue", scaling_study=True,
                paper_flops=paper_flops, constant_state=False, position_limit=True, extra_validate=validate,
                options=LlamaOptions, flat_options=FLAT,
                only_here={"n_kv_heads": "grouped-query attention"})
