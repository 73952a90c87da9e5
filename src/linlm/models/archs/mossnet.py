"""MossNet: a mixture of state-space experts (layers/mossnet.py) and a mixture of SwiGLU experts (layers/moe.py).

Preset rule (docs/mossnet.md, "Sizes"): on every paper-* row MossNet keeps d and n_layers, expand = 2, E = 4 SSM
experts (k = 2, routed, S6) and 8 MLP experts (k = 2); the MLP expert width is solved (to a multiple of 8) so that
its *active* non-embedding parameters match the row's LLaMA. The match holds for these settings: overriding expert
counts or the policy changes the active size (``linlm count`` shows by how much). Counts come from the meta device.
"""

from __future__ import annotations

from dataclasses import dataclass

from linlm.errors import choices_text
from linlm.layers.moe import MoEMLP
from linlm.layers.mossnet import KERNELS, POLICIES, MossNetMixer
from linlm.models.archs.base import MIXTURE, ArchSpec, SizeKnob, own_names
from linlm.models.archs.mamba import MambaOptions
from linlm.schema import config_error

# MossNet's expert settings on the paper presets; the small presets keep E small so that tests run fast.
PAPER_SETTINGS = dict(ssm_experts=4, ssm_top_k=2, mlp_experts=8, mlp_top_k=2, shared_experts=0,
                      ssm_policy="routed", ssm_kernel="s6")
SMALL_SETTINGS = dict(ssm_experts=4, ssm_top_k=2, mlp_experts=4, mlp_top_k=2)
EXPERT_DIM_MULTIPLE = 8


@dataclass(frozen=True)
class MossNetOptions(MambaOptions):
    """The Mamba block's shape, plus the two mixtures (see docs/architectures.md for which parts are
    reconstructions)."""

    ssm_experts: int = 4  # E, the SSM experts
    ssm_top_k: int = 2  # k of them per token
    mlp_experts: int = 8
    mlp_top_k: int = 2
    mlp_expert_dim: int = 0  # 0 means glu_dim // mlp_top_k, so that active MLP parameters match a dense GLU
    shared_experts: int = 0  # MLP experts every token uses
    ssm_policy: str = "routed"  # one of POLICIES (layers/mossnet.py)
    ssm_kernel: str = "s6"  # one of KERNELS
    balance_loss_coef: float = 0.01
    router_z_loss_coef: float = 0.0

    def validate(self) -> None:
        super().validate()
        self._check_top_k("ssm_top_k", "ssm_experts")
        self._check_top_k("mlp_top_k", "mlp_experts")
        if self.ssm_policy not in POLICIES:
            raise config_error("options.ssm_policy", f"unknown policy {self.ssm_policy!r}; valid choices are "
                                                     f"{choices_text(POLICIES)}")
        if self.ssm_kernel not in KERNELS:
            raise config_error("options.ssm_kernel", f"unknown kernel {self.ssm_kernel!r}; valid choices are "
                                                     f"{choices_text(KERNELS)}")
        for key in ("mlp_expert_dim", "shared_experts"):
            if getattr(self, key) < 0:
                raise config_error(f"options.{key}", f"must be >= 0 (0 means automatic), got {getattr(self, key)}")
        for key in ("balance_loss_coef", "router_z_loss_coef"):
            if getattr(self, key) < 0:
                raise config_error(f"options.{key}", f"must be >= 0, got {getattr(self, key)}")

    def _check_top_k(self, k_key: str, e_key: str) -> None:
        E, k = getattr(self, e_key), getattr(self, k_key)
        if E < 1:
            raise config_error(f"options.{e_key}", f"must be a positive number of experts, got {E}")
        if not 1 <= k <= E:
            raise config_error(f"options.{k_key}", f"{k} is out of range; valid values are 1..{E} "
                                                   f"(1 <= {k_key} <= {e_key}={E})", related=[f"options.{e_key}"])


def moe_expert_dim(cfg) -> int:
    """options.mlp_expert_dim, or glu_hidden // (k + shared) when 0: then active MLP parameters match a dense GLU."""
    o = cfg.options
    return o.mlp_expert_dim or cfg.glu_hidden // (o.mlp_top_k + o.shared_experts)


def moe_mlp(cfg, layer_idx):
    o = cfg.options
    return MoEMLP(cfg.d_model, o.mlp_experts, o.mlp_top_k, moe_expert_dim(cfg), o.shared_experts,
                  o.balance_loss_coef, o.router_z_loss_coef, cfg.init_std)


def validate(cfg) -> None:
    o = cfg.options
    if moe_expert_dim(cfg) < 1:
        raise config_error(
            "options.mlp_expert_dim", f"the automatic width glu_hidden // (mlp_top_k + shared_experts) = "
            f"{cfg.glu_hidden} // {o.mlp_top_k + o.shared_experts} is 0; set mlp_expert_dim >= 1 or a larger glu_dim",
            related=["glu_dim"])


def preset_rule(preset: str, row: dict, layer_params) -> dict:
    if not preset.startswith("paper-"):
        row["options"] = {**row["options"], **SMALL_SETTINGS}
        return row
    row["options"] = {**row["options"], **PAPER_SETTINGS}
    target = layer_params({**row, "arch": "llama", "options": None})[0]  # per layer; both stacks end with one norm

    def active_at(width: int) -> int:
        return layer_params({**row, "arch": "mossnet", "options": {**row["options"], "mlp_expert_dim": width}})[1]

    # A block's active parameters grow linearly with the expert width (k + shared experts of 3 d h each).
    m = EXPERT_DIM_MULTIPLE
    at_m = active_at(m)
    per_unit = (active_at(2 * m) - at_m) / m
    h = m + (target - at_m) / per_unit
    row["options"]["mlp_expert_dim"] = max(m, m * round(h / m))
    return row


SPEC = ArchSpec("mossnet", MossNetMixer, moe_mlp, "rms",
                "MossNet: mixture of state-space experts (routed S6/SSD experts) and a mixture of SwiGLU experts",
                family=MIXTURE, paper="arXiv 2510.26182", color="tab:brown",
                extra_validate=validate, preset_rule=preset_rule,
                size_knob=SizeKnob("options.mlp_expert_dim", EXPERT_DIM_MULTIPLE), options=MossNetOptions,
                flat_options=own_names(MossNetOptions))
