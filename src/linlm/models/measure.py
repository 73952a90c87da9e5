"""Walks over modules that measure them: forward FLOPs per token and active parameters.

A module may refine the walk with hooks:
- ``flops_per_token(seq_len)``: its whole forward FLOPs per token (the walk does not descend into it);
- ``mixing_flops_per_token(seq_len)``: FLOPs of its sequence mixing, added to its linear layers;
- ``active_params()``: the parameters one token uses (mixture-of-experts layers).
"""

from __future__ import annotations

from torch import nn


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
