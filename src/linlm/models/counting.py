"""Parameter and FLOP counting, from modules instantiated on the meta device (no memory, no formula).

The walks themselves (and their hooks) live in models/measure.py. What the counts mean (paper against counted
FLOPs) and what training spends is :mod:`linlm.models.cost`.
"""

from __future__ import annotations

from typing import Optional

from linlm.layers.shell import meta_device
from linlm.models.model_config import ModelConfig
from linlm.models.lm import CausalLM
from linlm.models.measure import active_params, forward_flops_per_token
from linlm.models.presets import preset_config
from linlm.models.registry import get_arch

__all__ = ["active_params", "count", "count_preset", "forward_flops_per_token", "meta_model"]


def meta_model(cfg: ModelConfig) -> CausalLM:
    with meta_device():
        return CausalLM(cfg)


def count(cfg: ModelConfig, batch: int = 480, seq_len: int = 8192) -> dict:
    """Counts for one config. FLOPs exclude the embedding lookup; the tied LM head is reported apart.

    ``counted_flops_per_token`` is counted from the layer shapes; ``flops_per_step`` is the paper's formula where
    the architecture has one (:mod:`linlm.models.cost` keeps the two apart)."""
    model = meta_model(cfg)
    spec = get_arch(cfg.arch)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.embed.weight.numel()
    body = [m for name, m in model.named_children() if name not in ("embed",)]
    fwd = sum(forward_flops_per_token(m, seq_len) for m in body)
    # A paper's formula describes its own stack; a hybrid's attention layers are outside it.
    formula = spec.paper_flops if not cfg.attention_layers else None
    head_fwd = 2.0 * cfg.d_model * cfg.vocab_size
    out = {
        "arch": cfg.arch,
        "total_params": total,
        "non_embedding_params": total - embedding,
        "active_non_embedding_params": active_params(model) - embedding,
        "embedding_params": embedding,
        "batch": batch,
        "seq_len": seq_len,
        # Training (forward + backward = 3 x forward) FLOPs per token of the non-embedding body.
        "counted_flops_per_token": 3.0 * fwd,
        "forward_flops_per_token": fwd,
        "lm_head_flops_per_token": 3.0 * head_fwd,
        "flops_per_step": formula(cfg, batch, seq_len) if formula else 3.0 * fwd * batch * seq_len,
        "flops_per_step_source": "paper formula" if formula else "counted from layer shapes",
        "config": cfg.to_dict(),
    }
    out["pflops_per_step"] = out["flops_per_step"] / 1e15
    return out


def count_preset(arch: str, preset: Optional[str], batch: int = 480, seq_len: int = 8192, **overrides) -> dict:
    return count(preset_config(arch, preset, **overrides), batch=batch, seq_len=seq_len)
