"""Registry entries for the SSM architectures: the Mamba baseline and MossNet (mixture of state-space experts).

Also their preset rule (docs/mossnet.md, "Sizes"): on every paper-* row, Mamba and MossNet get the *active*
non-embedding parameters of that row's LLaMA, at the row's width d.

- Mamba (no MLP) keeps d and expand = 2; n_layers is the count closest to LLaMA's parameters, and dt_rank (a small
  part of each layer) is then set to close the remaining gap.
- MossNet keeps d and n_layers, expand = 2, E = 4 SSM experts (k = 2, routed, S6) and 8 MLP experts (k = 2);
  the MLP expert width is solved (to a multiple of 8) so that active parameters match.
The match holds for these settings: overriding expert counts or the policy changes the active size (rerun
``linlm count`` to see by how much).
"""

from __future__ import annotations

import math

from linlm.errors import ConfigError, choices_text
from linlm.layers.mamba import MambaMixer
from linlm.layers.moe import MoEMLP
from linlm.layers.mossnet import KERNELS, POLICIES, MossNetMixer
from linlm.models.config import ModelConfig
from linlm.models.presets import PRESET_ADJUSTERS
from linlm.models.registry import ArchSpec, register

# MossNet's expert settings on the presets (tiny and small keep E small so that tests run fast).
MOSSNET_PRESET = dict(ssm_experts=4, ssm_top_k=2, mlp_experts=8, mlp_top_k=2, shared_experts=0,
                      ssm_policy="routed", ssm_kernel="s6")
MOSSNET_SMALL = dict(ssm_experts=4, ssm_top_k=2, mlp_experts=4, mlp_top_k=2)
EXPERT_DIM_MULTIPLE = 8


def moe_expert_dim(cfg) -> int:
    """cfg.mlp_expert_dim, or glu_hidden // (k + shared) when 0: then active MLP parameters match a dense GLU."""
    return cfg.mlp_expert_dim or cfg.glu_hidden // (cfg.mlp_top_k + cfg.shared_experts)


def _moe_mlp(cfg, layer_idx):
    return MoEMLP(cfg.d_model, cfg.mlp_experts, cfg.mlp_top_k, moe_expert_dim(cfg), cfg.shared_experts,
                  cfg.balance_loss_coef, cfg.router_z_loss_coef, cfg.init_std)


def _check_top_k(cfg, k_key: str, e_key: str) -> None:
    E, k = getattr(cfg, e_key), getattr(cfg, k_key)
    if E < 1:
        raise ConfigError(f"{e_key}: must be a positive number of experts, got {E}")
    if not 1 <= k <= E:
        raise ConfigError(f"{k_key}: {k} is out of range; valid values are 1..{E} (1 <= {k_key} <= {e_key}={E})")


def _validate_mossnet(cfg) -> None:
    _check_top_k(cfg, "ssm_top_k", "ssm_experts")
    _check_top_k(cfg, "mlp_top_k", "mlp_experts")
    if cfg.ssm_policy not in POLICIES:
        raise ConfigError(f"ssm_policy: unknown policy {cfg.ssm_policy!r}; valid choices are {choices_text(POLICIES)}")
    if cfg.ssm_kernel not in KERNELS:
        raise ConfigError(f"ssm_kernel: unknown kernel {cfg.ssm_kernel!r}; valid choices are {choices_text(KERNELS)}")
    for key in ("balance_loss_coef", "router_z_loss_coef"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{key}: must be >= 0, got {getattr(cfg, key)}")
    if moe_expert_dim(cfg) < 1:
        raise ConfigError(
            f"mlp_expert_dim: the automatic width glu_hidden // (mlp_top_k + shared_experts) = {cfg.glu_hidden} // "
            f"{cfg.mlp_top_k + cfg.shared_experts} is 0; set mlp_expert_dim >= 1 or a larger glu_dim"
        )


register(ArchSpec("mamba", MambaMixer, None, "rms",
                  "Mamba: Mamba-1 selective-scan blocks (the SSM baseline), no separate MLP"))
register(ArchSpec("mossnet", MossNetMixer, _moe_mlp, "rms",
                  "MossNet: mixture of state-space experts (routed S6/SSD experts) and a mixture of SwiGLU experts",
                  extra_validate=_validate_mossnet))


# ----------------------------------------------------------------------------------------------------------------
# Presets: match the LLaMA row's non-embedding parameters with active parameters.

def _get(row: dict, key: str):
    return row[key] if key in row else getattr(ModelConfig(), key)


def llama_non_embedding(row: dict) -> int:
    """LLaMA's non-embedding parameters for a preset row: l (4 d^2 + 3 d g + 2 d) + d (final norm)."""
    d, L, g = row["d_model"], row["n_layers"], row["glu_dim"]
    return L * (4 * d * d + 3 * d * g + 2 * d) + d


def _mixer_shared(d: int, Din: int, kernel: int) -> int:
    """in_proj + conv (weight and bias) + out_proj."""
    return d * 2 * Din + Din * (kernel + 1) + Din * d


def _s6_expert(Din: int, N: int, R: int) -> int:
    """x_proj (dt~, B, C) + dt_proj weight and bias + A_log + D."""
    return Din * (R + 2 * N) + Din * R + Din + Din * N + Din


def mamba_layer_params(d: int, expand: int, d_state: int, d_conv: int, rank: int) -> int:
    Din = expand * d
    return _mixer_shared(d, Din, d_conv) + _s6_expert(Din, d_state, rank) + d  # + the block's RMSNorm


def _adjust_mamba(preset: str, row: dict) -> dict:
    if not preset.startswith("paper-"):
        return row
    row = dict(row)
    d, expand, N, K = row["d_model"], _get(row, "expand"), _get(row, "d_state"), _get(row, "d_conv")
    target = llama_non_embedding(row) - d  # both stacks end with an RMSNorm of width d
    default_rank = math.ceil(d / 16)
    layers = max(1, round(target / mamba_layer_params(d, expand, N, K, default_rank)))
    per_layer = target / layers
    # Each unit of dt_rank adds 2 Din parameters (x_proj column and dt_proj row).
    rank = round((per_layer - mamba_layer_params(d, expand, N, K, 0)) / (2 * expand * d))
    row.update(n_layers=layers, dt_rank=max(1, rank))
    return row


def mossnet_layer_active_params(row: dict) -> int:
    """Active parameters of one MossNet layer under the row's settings (routed or dense; S6 or SSD)."""
    d, expand, N, K = row["d_model"], _get(row, "expand"), _get(row, "d_state"), _get(row, "d_conv")
    Din = expand * d
    E, k = _get(row, "ssm_experts"), _get(row, "ssm_top_k")
    if _get(row, "ssm_kernel") == "s6":
        expert = _s6_expert(Din, N, _get(row, "dt_rank") or math.ceil(d / 16))
    else:
        expert = Din * (1 + 2 * N) + 1 + 1 + Din  # x_proj, dt bias, A_log, D
    active_experts = k if _get(row, "ssm_policy") == "routed" else E
    mixer = _mixer_shared(d, Din, K) + d * E + active_experts * expert
    Em, km, S = _get(row, "mlp_experts"), _get(row, "mlp_top_k"), _get(row, "shared_experts")
    h = row["mlp_expert_dim"]
    return mixer + d * Em + (km + S) * 3 * d * h + 2 * d


def _adjust_mossnet(preset: str, row: dict) -> dict:
    row = dict(row)
    if not preset.startswith("paper-"):
        row.update(MOSSNET_SMALL)
        return row
    row.update(MOSSNET_PRESET)
    d, L = row["d_model"], row["n_layers"]
    per_layer = (llama_non_embedding(row) - d) / L
    without_mlp = mossnet_layer_active_params({**row, "mlp_expert_dim": 0})
    units = (_get(row, "mlp_top_k") + _get(row, "shared_experts")) * 3 * d
    h = (per_layer - without_mlp) / units
    row["mlp_expert_dim"] = max(EXPERT_DIM_MULTIPLE, EXPERT_DIM_MULTIPLE * round(h / EXPERT_DIM_MULTIPLE))
    return row


PRESET_ADJUSTERS["mamba"] = _adjust_mamba
PRESET_ADJUSTERS["mossnet"] = _adjust_mossnet
