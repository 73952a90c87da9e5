"""Parameter and FLOP counting, from modules instantiated on the meta device (no memory, no formula).

A module may refine the walk with two hooks:
- ``flops_per_token(seq_len)``: its whole forward FLOPs per token (the walk does not descend into it);
- ``mixing_flops_per_token(seq_len)``: FLOPs of its sequence mixing, added to its linear layers;
- ``active_params()``: the parameters one token uses (mixture-of-experts layers).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from linlm.models.config import ModelConfig
from linlm.models.presets import preset_config
from linlm.models.registry import get_arch


def forward_flops_per_token(module: nn.Module, seq_len: int) -> float:
    if hasattr(module, "flops_per_token"):
        return float(module.flops_per_token(seq_len))
    if isinstance(module, nn.Linear):
        return 2.0 * module.in_features * module.out_features
    total = sum(forward_flops_per_token(c, seq_len) for c in module.children())
    if hasattr(module, "mixing_flops_per_token"):
        total += float(module.mixing_flops_per_token(seq_len))
    return total


def active_params(module: nn.Module) -> int:
    if hasattr(module, "active_params"):
        return int(module.active_params())
    own = sum(p.numel() for p in module.parameters(recurse=False))
    return own + sum(active_params(c) for c in module.children())


def meta_model(cfg: ModelConfig):
    from linlm.models.lm import CausalLM

    with torch.device("meta"):
        return CausalLM(cfg)


def count(cfg: ModelConfig, batch: int = 480, seq_len: int = 8192) -> dict:
    """Counts for one config. FLOPs exclude the embedding lookup; the tied LM head is reported apart."""
    model = meta_model(cfg)
    spec = get_arch(cfg.arch)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.embed.weight.numel()
    body = [m for name, m in model.named_children() if name not in ("embed",)]
    fwd = sum(forward_flops_per_token(m, seq_len) for m in body)
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
        "flops_per_token": 3.0 * fwd,
        "forward_flops_per_token": fwd,
        "lm_head_flops_per_token": 3.0 * head_fwd,
        "flops_per_step": spec.paper_flops(cfg, batch, seq_len) if spec.paper_flops else 3.0 * fwd * batch * seq_len,
        "flops_per_step_source": "paper formula" if spec.paper_flops else "counted from layer shapes",
        "config": cfg.to_dict(),
    }
    out["pflops_per_step"] = out["flops_per_step"] / 1e15
    return out


def count_preset(arch: str, preset: Optional[str], batch: int = 480, seq_len: int = 8192, **overrides) -> dict:
    return count(preset_config(arch, preset, **overrides), batch=batch, seq_len=seq_len)
