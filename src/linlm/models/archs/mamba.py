"""Mamba: Mamba-1 selective-scan blocks (the SSM baseline), no separate MLP, RMSNorm.

Preset rule (docs/mossnet.md, "Sizes"): on every paper-* row Mamba keeps d and expand = 2 and gets that row's
LLaMA non-embedding parameters. n_layers is the count closest to them at the default dt_rank; dt_rank (a small part
of each layer) is then set to close the remaining gap. Every count comes from blocks built on the meta device.
"""

from __future__ import annotations

from linlm.layers.mamba import MambaMixer
from linlm.models.archs.base import SSM, ArchSpec


def preset_rule(preset: str, row: dict, layer_params) -> dict:
    if not preset.startswith("paper-"):
        return row
    # Both stacks end with one norm of width d, so matching the blocks matches the non-embedding parameters.
    target = row["n_layers"] * layer_params({**row, "arch": "llama"})[0]
    mamba = {**row, "arch": "mamba"}
    layers = max(1, round(target / layer_params({**mamba, "dt_rank": 0})[0]))  # 0: the default rank
    # A block's parameters grow linearly with dt_rank (its x_proj column and dt_proj row).
    at_1 = layer_params({**mamba, "dt_rank": 1})[0]
    per_rank = layer_params({**mamba, "dt_rank": 2})[0] - at_1
    rank = round(1 + (target / layers - at_1) / per_rank)
    row.update(n_layers=layers, dt_rank=max(1, rank))
    return row


SPEC = ArchSpec("mamba", MambaMixer, None, "rms",
                "Mamba: Mamba-1 selective-scan blocks (the SSM baseline), no separate MLP",
                family=SSM, paper="arXiv 2312.00752", color="tab:purple",
                preset_rule=preset_rule)
