"""The model config: one flat dataclass shared by every architecture.

Options added after models were first saved default to the authors' choice for new models. A saved config that
predates such an option (its config.json lacks the key) is read with :meth:`ModelConfig.from_saved`, which fills
the key with the value linlm used before (``SAVED_BEFORE``), so an old checkpoint computes exactly what it did.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from linlm.config import config_error, from_dict
from linlm.errors import choices_text
from linlm.layers.norm import NORM_KINDS
from linlm.models.registry import ARCHITECTURES

ROPE_SCALINGS = ("none", "llama3")


@dataclass
class ModelConfig:
    arch: str = "llama"
    vocab_size: int = 8192
    d_model: int = 512
    n_layers: int = 6
    n_heads: int = 4
    # Hidden width of the GLU channel mixer; 0 means round(8/3 * d_model) up to a multiple of 64.
    glu_dim: int = 0
    # Longest input a model with absolute limits (LLaMA's RoPE cache) accepts.
    max_seq_len: int = 8192
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # LLaMA layouts of real checkpoints. n_kv_heads < n_heads is grouped-query attention (0 means n_heads);
    # tie_embeddings=False gives the LM head its own weight.
    n_kv_heads: int = 0
    tie_embeddings: bool = True
    # RoPE frequency scaling: "none", or "llama3" (Llama 3.1's smooth long-context rescaling, with these parameters).
    rope_scaling: str = "none"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    # Chunk length of the chunkwise gated-linear-attention form (linear models).
    chunk_size: int = 64
    init_std: float = 0.02
    # cosFormer2: apply the Toeplitz positional encoding to the embeddings.
    tpe: bool = True
    # Norm of the blocks and the final norm: "auto" is the architecture's own (RMSNorm with a weight for LLaMA, Mamba
    # and MossNet; SRMSNorm without one for TNL, HGRN2, cosFormer2); "rms", "srms" or "layer" (LayerNorm with a
    # weight and a bias) replace it. docs/architectures.md: "layer" reproduces the paper's printed LLaMA counts.
    norm_type: str = "auto"
    # TNL decay slopes: "alibi" builds them as the authors' code does (it differs from 2^(-8(h+1)/H) when H is not a
    # power of two); "pow2" is 2^(-8(h+1)/H) for every H, what linlm used before.
    tnl_slopes: str = "alibi"
    # TNL applies SiLU to v as well as to q and k (the authors' code); False leaves v linear, as linlm did before.
    tnl_v_silu: bool = True
    # cosFormer2 gates before the norm, Norm(o * gate) W_o (the authors' code); False is Norm(o) * gate, as before.
    cosformer2_gate_before_norm: bool = True

    # Mamba / MossNet time mixer.
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    dt_rank: int = 0  # 0 means ceil(d_model / 16)

    # MossNet routing (see docs/architectures.md for which parts are reconstructions).
    ssm_experts: int = 4
    ssm_top_k: int = 2
    mlp_experts: int = 8
    mlp_top_k: int = 2
    mlp_expert_dim: int = 0  # 0 means glu_dim // mlp_top_k, so that active MLP parameters match a dense GLU
    shared_experts: int = 0
    ssm_policy: str = "routed"
    ssm_kernel: str = "s6"
    balance_loss_coef: float = 0.01
    router_z_loss_coef: float = 0.0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def glu_hidden(self) -> int:
        if self.glu_dim:
            return self.glu_dim
        g = int(round(8 * self.d_model / 3))
        return (g + 63) // 64 * 64

    def validate(self) -> "ModelConfig":
        if self.arch not in ARCHITECTURES:
            raise config_error("arch", f"unknown architecture {self.arch!r}; valid choices are "
                                       f"{choices_text(ARCHITECTURES)}")
        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "chunk_size", "d_state", "d_conv", "expand"):
            value = getattr(self, key)
            if value <= 0:
                raise config_error(key, f"must be a positive integer, got {value}")
        for key in ("glu_dim", "dt_rank", "mlp_expert_dim", "shared_experts"):
            value = getattr(self, key)
            if value < 0:
                raise config_error(key, f"must be >= 0 (0 means automatic), got {value}")
        for key in ("norm_eps", "init_std", "rope_theta"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):  # also when built directly, without from_dict
                raise config_error(key, f"must be a positive finite number, got {value}")
        if self.norm_type != "auto" and self.norm_type not in NORM_KINDS:
            raise config_error("norm_type", f"unknown norm {self.norm_type!r}; valid choices are "
                                            f"{choices_text(('auto', *NORM_KINDS))}")
        if self.d_model % self.n_heads:
            raise config_error(
                "d_model", f"{self.d_model} is not divisible by n_heads={self.n_heads}; "
                f"choose n_heads among the divisors of d_model (for example {_divisors(self.d_model)})",
                related=["n_heads"],
            )
        self._validate_llama_layout()
        ARCHITECTURES[self.arch].validate(self)
        return self

    def _validate_llama_layout(self) -> None:
        if self.n_kv_heads < 0 or self.n_heads % self.kv_heads:
            raise config_error("n_kv_heads", f"{self.n_kv_heads} must divide n_heads={self.n_heads} (0 means n_heads); "
                               f"choose among {[h for h in range(1, self.n_heads + 1) if self.n_heads % h == 0]}",
                               related=("n_heads",))
        if self.n_kv_heads not in (0, self.n_heads) and self.arch != "llama":
            raise config_error("n_kv_heads", f"grouped-query attention exists only for arch 'llama', not {self.arch!r}",
                               related=("arch",))
        if self.rope_scaling not in ROPE_SCALINGS:
            raise config_error("rope_scaling", f"unknown scaling {self.rope_scaling!r}; valid choices are "
                               f"{choices_text(ROPE_SCALINGS)}")
        if self.rope_scaling == "llama3" and not (
            self.rope_factor >= 1 and 0 < self.rope_low_freq_factor < self.rope_high_freq_factor
            and self.rope_original_max_len > 0
        ):
            raise config_error(
                "rope_factor", "llama3 scaling needs factor >= 1, 0 < low < high and a positive original length, got "
                f"rope_factor={self.rope_factor}, rope_low_freq_factor={self.rope_low_freq_factor}, "
                f"rope_high_freq_factor={self.rope_high_freq_factor}, rope_original_max_len={self.rope_original_max_len}",
                related=("rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_len", "rope_scaling"))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        return from_dict(cls, data).validate()

    @classmethod
    def from_saved(cls, data: Mapping[str, Any]) -> "ModelConfig":
        """A config read back from a saved model or checkpoint: keys it lacks take the values of ``SAVED_BEFORE``."""
        return cls.from_dict({**SAVED_BEFORE, **data})

    def replace(self, **overrides: Any) -> "ModelConfig":
        return ModelConfig.from_dict({**self.to_dict(), **overrides})


# Options whose default changed: the value a config saved before the option existed was computed with.
SAVED_BEFORE: dict[str, Any] = {"tnl_slopes": "pow2", "tnl_v_silu": False, "cosformer2_gate_before_norm": False}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 64) + 1) if n % d == 0][-6:]
