"""The architecture registry: what is specific to each model, and nothing else.

Every architecture is the same pre-norm residual stack (models/lm.py); an entry names its token mixer,
its channel mixer, its norm, optional model-level pieces, and the paper's FLOP formula.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from torch import nn

from linlm.layers.attention import Attention
from linlm.layers.cosformer2 import TPE, CosFormer2Mixer
from linlm.layers.glu import GLU
from linlm.layers.hgrn2 import HGRN2Mixer, LowerBounds
from linlm.layers.tnl import TNLMixer


@dataclass(frozen=True)
class ArchSpec:
    name: str
    mixer: Callable[..., nn.Module]  # (cfg, layer_idx) -> token mixer
    mlp: Optional[Callable[..., nn.Module]]  # (cfg, layer_idx) -> channel mixer, or None (Mamba)
    norm: str  # "rms" (with weight) or "srms" (no weight)
    description: str
    # FLOPs of one training step (fwd + bwd) by the paper's formula, embeddings excluded: (cfg, b, n) -> float
    paper_flops: Optional[Callable[..., float]] = None
    # Model-level module whose output every layer receives as ctx (HGRN2's lower-bound table).
    shared: Optional[Callable[..., nn.Module]] = None
    # Applied once to the embeddings (cosFormer2's TPE), when the config enables it.
    embed_mixer: Optional[Callable[..., nn.Module]] = None
    # True when the decoding state does not grow with the context.
    constant_state: bool = True
    # True when inputs longer than cfg.max_seq_len must be refused.
    position_limit: bool = False
    extra_validate: Optional[Callable[..., None]] = None

    def validate(self, cfg) -> None:
        if self.extra_validate is not None:
            self.extra_validate(cfg)


def _swiglu(cfg, layer_idx):
    return GLU(cfg.d_model, cfg.glu_hidden, activation="silu")


def _sglu(cfg, layer_idx):
    return GLU(cfg.d_model, cfg.glu_hidden, activation=None)


def _base(cfg, b, n):
    return 72.0 * b * n * cfg.n_layers * cfg.d_model**2


def _llama_flops(cfg, b, n):
    d = cfg.d_model
    return _base(cfg, b, n) * (1 + n / (6 * d) + 5 / (18 * d))


def _tnl_flops(cfg, b, n):
    d, h = cfg.d_model, cfg.n_heads
    return _base(cfg, b, n) * (1 + 1 / (2 * h) + 5 / (18 * d))


def _hgrn2_flops(cfg, b, n):
    d, h = cfg.d_model, cfg.n_heads
    return _base(cfg, b, n) * (1 + 1 / (3 * h) + 29 / (72 * d))


def _cosformer2_flops(cfg, b, n):
    d, h = cfg.d_model, cfg.n_heads
    return _base(cfg, b, n) * (1 + 3 / (4 * h) + 23 / (72 * d)) + 12.0 * b * n * d**2 / h


def _even_head_dim(cfg):
    from linlm.errors import ConfigError

    if cfg.head_dim % 2:
        raise ConfigError(
            f"d_model / n_heads = {cfg.head_dim} must be even for rotary embeddings; change d_model or n_heads"
        )


ARCHITECTURES: dict[str, ArchSpec] = {}


def register(spec: ArchSpec) -> ArchSpec:
    ARCHITECTURES[spec.name] = spec
    return spec


register(ArchSpec("llama", Attention, _swiglu, "rms", "LLaMA: softmax attention with RoPE, SwiGLU, RMSNorm",
                  paper_flops=_llama_flops, constant_state=False, position_limit=True, extra_validate=_even_head_dim))
register(ArchSpec("tnl", TNLMixer, _sglu, "srms", "TNL: linear attention with a constant decay per head",
                  paper_flops=_tnl_flops))
register(ArchSpec("hgrn2", HGRN2Mixer, _sglu, "srms", "HGRN2: gated linear attention with a data-dependent vector gate",
                  paper_flops=_hgrn2_flops, shared=LowerBounds))
register(ArchSpec("cosformer2", CosFormer2Mixer, _sglu, "srms", "cosFormer2: linear attention with LRPE and TPE, no decay",
                  paper_flops=_cosformer2_flops, embed_mixer=TPE))


def get_arch(name: str) -> ArchSpec:
    from linlm.errors import ConfigError, choices_text

    if name not in ARCHITECTURES:
        raise ConfigError(f"arch: unknown architecture {name!r}; valid choices are {choices_text(ARCHITECTURES)}")
    return ARCHITECTURES[name]


# Mamba and MossNet register themselves from their own module (it imports register() above).
from linlm.models import ssm_archs  # noqa: E402,F401
