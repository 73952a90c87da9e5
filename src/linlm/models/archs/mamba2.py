"""Mamba-2: SSD blocks (layers/mamba2.py), no separate MLP, RMSNorm (arXiv 2405.21060).

Preset rule: on every paper-* row Mamba-2 keeps d, expand = 2 and P = 64 (head_dim 0), and gets that row's LLaMA non-embedding
parameters: n_layers is the count closest to them at N = 64, then the state size N (a multiple of 16, at least
16; each unit adds 2 G d parameters to a layer's in_proj) closes what remains of the gap. Every count comes from
blocks built on the meta device.
"""

from __future__ import annotations

from dataclasses import dataclass

from linlm.layers.mamba2 import Mamba2Mixer, mamba2_dims
from linlm.models.archs.base import SSM, ArchSpec, SizeKnob, positive_ints
from linlm.schema import config_error

STATE_MULTIPLE = 16


@dataclass(frozen=True)
class Mamba2Options:
    d_state: int = 64  # N, the state per head and channel (the paper's 64; 128 in its larger models)
    d_conv: int = 4  # kernel of the causal depthwise convolution over x, B and C
    expand: int = 2  # inner width Din = expand * d_model
    # P, channels per head (H = Din / P heads); 0: the paper's 64 where it divides Din, else Din / n_heads (the
    # tiny widths of tests and smoke ladders)
    head_dim: int = 0
    n_groups: int = 1  # G, groups of B and C shared by H / G heads each

    def validate(self) -> None:
        positive_ints(self, "d_state", "d_conv", "expand", "n_groups")
        if self.head_dim < 0:
            raise config_error("options.head_dim", f"must be >= 0 (0 means automatic), got {self.head_dim}")


def validate(cfg) -> None:
    o = cfg.options
    d_inner = o.expand * cfg.d_model
    if o.head_dim and d_inner % o.head_dim:
        raise config_error("options.head_dim", f"{o.head_dim} does not divide the inner width expand * d_model = "
                           f"{d_inner}; choose a divisor of it", related=("options.expand", "d_model"))
    heads = d_inner // mamba2_dims(cfg)[2]
    if heads % o.n_groups:
        raise config_error("options.n_groups", f"{o.n_groups} does not divide the {heads} heads "
                           f"(expand * d_model / head_dim); choose a divisor of {heads}", related=("options.head_dim",))


def preset_rule(preset: str, row: dict, layer_params) -> dict:
    if not preset.startswith("paper-"):
        return row
    # Both stacks end with one norm of width d, so matching the blocks matches the non-embedding parameters.
    target = row["n_layers"] * layer_params({**row, "arch": "llama", "options": None})[0]

    def at_state(n: int) -> int:
        return layer_params({**row, "arch": "mamba2", "options": {**row["options"], "d_state": n}})[0]

    layers = max(1, round(target / at_state(64)))
    per_unit = (at_state(2 * STATE_MULTIPLE) - at_state(STATE_MULTIPLE)) / STATE_MULTIPLE
    n = 64 + (target / layers - at_state(64)) / per_unit
    row.update(n_layers=layers, options={**row["options"],
                                         "d_state": max(STATE_MULTIPLE, STATE_MULTIPLE * round(n / STATE_MULTIPLE))})
    return row


SPEC = ArchSpec("mamba2", Mamba2Mixer, None, "rms",
                "Mamba-2: SSD blocks (scalar data-dependent decay per head), no separate MLP",
                family=SSM, paper="arXiv 2405.21060", color="tab:pink", scaling_study=True, extra_validate=validate,
                preset_rule=preset_rule, size_knob=SizeKnob("options.d_state", STATE_MULTIPLE, layers=True),
                options=Mamba2Options)
