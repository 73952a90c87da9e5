"""HGRN2: gated linear attention with a data-dependent vector gate and a learned lower bound per layer."""

from __future__ import annotations

from linlm.layers.hgrn2 import HGRN2Mixer, LowerBounds
from linlm.models.archs.base import LINEAR_ATTENTION, ArchSpec, paper_base_flops, sglu


def paper_flops(cfg, b, n):
    """72 b n l d^2 (1 + 1/(3h) + 29/(72d))."""
    d, h = cfg.d_model, cfg.n_heads
    return paper_base_flops(cfg, b, n) * (1 + 1 / (3 * h) + 29 / (72 * d))


SPEC = ArchSpec("hgrn2", HGRN2Mixer, sglu, "srms", "HGRN2: gated linear attention with a data-dependent vector gate",
                family=LINEAR_ATTENTION, paper="arXiv 2404.07904", color="tab:green", scaling_study=True,
                paper_flops=paper_flops, shared=LowerBounds)
