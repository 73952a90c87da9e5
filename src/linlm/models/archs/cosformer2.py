"""cosFormer2: linear attention with learnable LRPE, no decay, and a Toeplitz positional encoding (TPE)."""

from __future__ import annotations

from dataclasses import dataclass

from linlm.layers.cosformer2 import TPE, CosFormer2Mixer
from linlm.models.archs.base import LINEAR_ATTENTION, ArchSpec, layers_on, paper_base_flops, sglu
from linlm.models.archs.tnl import PAPER_LAYERS


def paper_flops(cfg, b, n):
    """72 b n l d^2 (1 + 3/(4h) + 23/(72d)) + 12 b n d^2/h."""
    d, h = cfg.d_model, cfg.n_heads
    return paper_base_flops(cfg, b, n) * (1 + 3 / (4 * h) + 23 / (72 * d)) + 12.0 * b * n * d**2 / h


@dataclass(frozen=True)
class CosFormer2Options:
    # Gate before the norm, Norm(o * gate) W_o (the authors' code); False is Norm(o) * gate, what linlm did before.
    gate_before_norm: bool = True
    # Apply the Toeplitz positional encoding to the embeddings.
    tpe: bool = True


def tpe(cfg):
    return TPE(cfg) if cfg.options.tpe else None


SPEC = ArchSpec("cosformer2", CosFormer2Mixer, sglu, "srms", "cosFormer2: linear attention with LRPE and TPE, no decay",
                family=LINEAR_ATTENTION, paper="arXiv 2406.16690", color="tab:red", scaling_study=True,
                paper_flops=paper_flops, embed_mixer=tpe, preset_rule=layers_on(PAPER_LAYERS),
                options=CosFormer2Options,
                flat_options={"cosformer2_gate_before_norm": "gate_before_norm", "tpe": "tpe"},
                saved_before={"gate_before_norm": False})
