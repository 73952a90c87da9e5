"""LLaMA: softmax attention with RoPE, SwiGLU and RMSNorm; decodes with a KV cache."""

from __future__ import annotations

from linlm.errors import ConfigError
from linlm.layers.attention import Attention
from linlm.models.archs.base import BASELINE, ArchSpec, paper_base_flops, swiglu


def paper_flops(cfg, b, n):
    """72 b n l d^2 (1 + n/(6d) + 5/(18d))."""
    d = cfg.d_model
    return paper_base_flops(cfg, b, n) * (1 + n / (6 * d) + 5 / (18 * d))


def validate(cfg) -> None:
    if cfg.head_dim % 2:
        raise ConfigError(
            f"d_model / n_heads = {cfg.head_dim} must be even for rotary embeddings; change d_model or n_heads"
        )


SPEC = ArchSpec("llama", Attention, swiglu, "rms", "LLaMA: softmax attention with RoPE, SwiGLU, RMSNorm",
                family=BASELINE, paper="arXiv 2302.13971", color="tab:blue", scaling_study=True,
                paper_flops=paper_flops, constant_state=False, position_limit=True, extra_validate=validate)
