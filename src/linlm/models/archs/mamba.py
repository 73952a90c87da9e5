"""Mamba: Mamba-1 selective-scan blocks (the SSM baseline), no separate MLP, RMSNorm.

Preset rule (docs/mossnet.md, "Sizes"): on every paper-* row Mamba keeps d and expand = 2 and gets that row's
LLaMA non-embedding parameters. n_layers is the count closest to them at the default dt_rank; dt_rank (a small part
of each layer) is then set to close the remaining gap. Every count comes from blocks built on the meta device.
"""

from __future__ import annotations

from dataclasses import dataclass

from linlm.layers.mamba import MambaMixer
from linlm.models.archs.base import SSM, ArchSpec, SizeKnob, own_names, positive_ints
from linlm.schema import config_error


@dataclass(frozen=True)
class MambaOptions:
    """The selective-scan block's shape (Mamba's names); MossNet's options extend it."""

    d_state: int = 16  # N, the state per channel
    d_conv: int = 4  # kernel of the causal depthwise convolution
    expand: int = 2  # inner width Din = expand * d_model
    dt_rank: int = 0  # rank R of the dt projection; 0 means ceil(d_model / 16)

    def validate(self) -> None:
        positive_ints(self, "d_state", "d_conv", "expand")
        if self.dt_rank < 0:
            raise config_error("options.dt_rank", f"must be >= 0 (0 means automatic), got {self.dt_rank}")


def preset_rule(preset: str, row: dict, layer_params) -> dict:
    if not preset.startswith("paper-"):
        return row
    # Both stacks end with one norm of width d, so matching the blocks matches the non-embedding parameters.
    target = row["n_layers"] * layer_params({**row, "arch": "llama", "options": None})[0]

    def at_rank(rank: int) -> int:
        return layer_params({**row, "arch": "mamba", "options": {**row["options"], "dt_rank": rank}})[0]

    layers = max(1, round(target / at_rank(0)))  # 0: the default rank
    # A block's parameters grow linearly with dt_rank (its x_proj column and dt_proj row).
    at_1 = at_rank(1)
    rank = round(1 + (target / layers - at_1) / (at_rank(2) - at_1))
    row.update(n_layers=layers, options={**row["options"], "dt_rank": max(1, rank)})
    return row


SPEC = ArchSpec("mamba", MambaMixer, None, "rms",
                "Mamba: Mamba-1 selective-scan blocks (the SSM baseline), no separate MLP",
                family=SSM, paper="arXiv 2312.00752", color="tab:purple",
                preset_rule=preset_rule, size_knob=SizeKnob("options.dt_rank", 1, layers=True), options=MambaOptions, flat_options=own_names(MambaOptions))
