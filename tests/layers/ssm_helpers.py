"""Helpers shared by the Mamba and MossNet tests."""

import math

import torch


def randomize_(module, seed=0):
    """Asymmetric random weights of a useful scale (so that transposes and swapped pieces or experts show)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 2.0 - 1.5)  # decays exp(dt A) well inside (0, 1)
    return module
