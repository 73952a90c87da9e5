"""TNL: linear attention with a constant decay per head and layer (layers/tnl.py), SGLU, SRMSNorm."""

from __future__ import annotations

from dataclasses import dataclass

from linlm.schema import config_error
from linlm.errors import choices_text
from linlm.layers.tnl import SLOPE_RULES, TNLMixer
from linlm.models.archs.base import LINEAR_ATTENTION, ArchSpec, layers_on, paper_base_flops, sglu

# The paper's ladder gives TNL (and cosFormer2) 25 layers at 410M, where LLaMA and HGRN2 have 26.
PAPER_LAYERS = {"paper-410m": 25}


def paper_flops(cfg, b, n):
    """72 b n l d^2 (1 + 1/(2h) + 5/(18d))."""
    d, h = cfg.d_model, cfg.n_heads
    return paper_base_flops(cfg, b, n) * (1 + 1 / (2 * h) + 5 / (18 * d))


@dataclass(frozen=True)
class TNLOptions:
    # Decay slopes: "alibi" builds them as the authors' code does (it differs from 2^(-8(h+1)/H) when H is not a
    # power of two); "pow2" is 2^(-8(h+1)/H) for every H, what linlm used before.
    slopes: str = "alibi"
    # SiLU on v as well as on q and k (the authors' code); False leaves v linear, as linlm did before.
    v_silu: bool = True

    def validate(self) -> None:
        if self.slopes not in SLOPE_RULES:
            raise config_error("options.slopes", f"unknown rule {self.slopes!r}; valid choices are "
                                                 f"{choices_text(SLOPE_RULES)}")


SPEC = ArchSpec("tnl", TNLMixer, sglu, "srms", "TNL: linear attention with a constant decay per head",
                family=LINEAR_ATTENTION, paper="arXiv 2307.14995", color="tab:orange", scaling_study=True,
                paper_flops=paper_flops, preset_rule=layers_on(PAPER_LAYERS), options=TNLOptions,
                flat_options={"tnl_slopes": "slopes", "tnl_v_silu": "v_silu"},
                saved_before={"slopes": "pow2", "v_silu": False})
