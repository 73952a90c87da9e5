"""DeltaNet: the delta rule (layers/deltanet.py) with short convolutions, L2-normalised q and k, SwiGLU, RMSNorm.

Preset rule: on every paper-* row DeltaNet keeps d, n_layers and n_heads (head width d / H for keys and values)
and gets the row's LLaMA non-embedding parameters by its GLU width (``glu_matched_to_llama``).
"""

from __future__ import annotations

from dataclasses import dataclass

from linlm.layers.deltanet import DeltaNetMixer
from linlm.models.archs.base import LINEAR_ATTENTION, ArchSpec, GLU_KNOB, glu_matched_to_llama, swiglu
from linlm.schema import config_error


def check_short_conv(kernel: int) -> None:
    if kernel < 0:
        raise config_error("options.short_conv", f"must be >= 0 (0: no convolution), got {kernel}")


@dataclass(frozen=True)
class DeltaNetOptions:
    # Kernel size of the causal depthwise convolution over q, k and v (fla: conv_size; no bias); 0: none (SiLU only).
    short_conv: int = 4
    # beta = 2 sigmoid(.) in (0, 2) instead of sigmoid(.): transitions with negative eigenvalues (fla:
    # allow_neg_eigval, arXiv 2411.12537).
    neg_eigval: bool = False

    def validate(self) -> None:
        check_short_conv(self.short_conv)


SPEC = ArchSpec("deltanet", DeltaNetMixer, swiglu, "rms",
                "DeltaNet: linear attention with the delta rule (L2-normalised keys, short convolutions)",
                family=LINEAR_ATTENTION, paper="arXiv 2406.06484", color="gold", scaling_study=True,
                preset_rule=glu_matched_to_llama, size_knob=GLU_KNOB, options=DeltaNetOptions)
