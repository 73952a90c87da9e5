"""MossNet: a mixture of state-space experts (layers/mossnet.py) and a mixture of SwiGLU experts (layers/moe.py).

Preset rule (docs/mossnet.md, "Sizes"): on every paper-* row MossNet keeps d and n_layers, expand = 2, E = 4 SSM
experts (k = 2, routed, S6) and 8 MLP experts (k = 2); the MLP expert width is solved (to a multiple of 8) so that
its *active* non-embedding parameters match the row's LLaMA. The match holds for these settings: overriding expert
counts or the policy changes the active size (``linlm count`` shows by how much). Counts come from the meta device.
"""

from __future__ import annotations

from linlm.errors import ConfigError, choices_text
from linlm.layers.moe import MoEMLP
from linlm.layers.mossnet import KERNELS, POLICIES, MossNetMixer
from linlm.models.archs.base import MIXTURE, ArchSpec

# MossNet's expert settings on the paper presets; the small presets keep E small so that tests run fast.
PAPER_SETTINGS = dict(ssm_experts=4, ssm_top_k=2, mlp_experts=8, mlp_top_k=2, shared_experts=0,
                      ssm_policy="routed", ssm_kernel="s6")
SMALL_SETTINGS = dict(ssm_experts=4, ssm_top_k=2, mlp_experts=4, mlp_top_k=2)
EXPERT_DIM_MULTIPLE = 8


def moe_expert_dim(cfg) -> int:
    """cfg.mlp_expert_dim, or glu_hidden // (k + shared) when 0: then active MLP parameters match a dense GLU."""
    return cfg.mlp_expert_dim or cfg.glu_hidden // (cfg.mlp_top_k + cfg.shared_experts)


def moe_mlp(cfg, layer_idx):
    return MoEMLP(cfg.d_model, cfg.mlp_experts, cfg.mlp_top_k, moe_expert_dim(cfg), cfg.shared_experts,
                  cfg.balance_loss_coef, cfg.router_z_loss_coef, cfg.init_std)


def _check_top_k(cfg, k_key: str, e_key: str) -> None:
    E, k = getattr(cfg, e_key), getattr(cfg, k_key)
    if E < 1:
        raise ConfigError(f"{e_key}: must be a positive number of experts, got {E}")
    if not 1 <= k <= E:
        raise ConfigError(f"{k_key}: {k} is out of range; valid values are 1..{E} (1 <= {k_key} <= {e_key}={E})")


def validate(cfg) -> None:
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


def preset_rule(preset: str, row: dict, layer_params) -> dict:
    if not preset.startswith("paper-"):
        row.update(SMALL_SETTINGS)
        return row
    row.update(PAPER_SETTINGS)
    target = layer_params({**row, "arch": "llama"})[0]  # per layer; both stacks end with one norm of width d
    # A block's active parameters grow linearly with the expert width (k + shared experts of 3 d h each).
    m = EXPERT_DIM_MULTIPLE
    at_m = layer_params({**row, "arch": "mossnet", "mlp_expert_dim": m})[1]
    per_unit = (layer_params({**row, "arch": "mossnet", "mlp_expert_dim": 2 * m})[1] - at_m) / m
    h = m + (target - at_m) / per_unit
    row["mlp_expert_dim"] = max(m, m * round(h / m))
    return row


SPEC = ArchSpec("mossnet", MossNetMixer, moe_mlp, "rms",
                "MossNet: mixture of state-space experts (routed S6/SSD experts) and a mixture of SwiGLU experts",
                family=MIXTURE, paper="arXiv 2510.26182", color="tab:brown",
                extra_validate=validate, preset_rule=preset_rule)
