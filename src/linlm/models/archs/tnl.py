"""TNL: linear attention with a constant decay per head and layer (layers/tnl.py), SGLU, SRMSNorm."""

from __future__ import annotations

from linlm.errors import ConfigError, choices_text
from linlm.layers.tnl import SLOPE_RULES, TNLMixer
from linlm.models.archs.base import LINEAR_ATTENTION, ArchSpec, layers_on, paper_base_flops, sglu

# The paper's ladder gives TNL (and cosFormer2) 25 layers at 410M, where LLaMA and HGRN2 have 26.
PAPER_LAYERS = {"paper-410m": 25}


def paper_flops(cfg, b, n):
    """72 b n l d^2 (1 + 1/(2h) + 5/(18d))."""
    d, h = cfg.d_model, cfg.n_heads
    return paper_base_flops(cfg, b, n) * (1 + 1 / (2 * h) + 5 / (18 * d))


def validate(cfg) -> None:
    if cfg.tnl_slopes not in SLOPE_RULES:
        raise ConfigError(f"tnl_slopes: unknown rule {cfg.tnl_slopes!r}; valid choices are {choices_text(SLOPE_RULES)}")


SPEC = ArchSpec("tnl", TNLMixer, sglu, "srms", "TNL: linear attention with a constant decay per head",
                family=LINEAR_ATTENTION, paper="arXiv 2307.14995", color="tab:orange", scaling_study=True,
                paper_flops=paper_flops, extra_validate=validate, preset_rule=layers_on(PAPER_LAYERS))
