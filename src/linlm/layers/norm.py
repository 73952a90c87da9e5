"""RMSNorm (with a weight) and SRMSNorm (simple RMSNorm, no weight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.ops.fused import rms_norm


class RMSNorm(nn.Module):
    """x / rms(x) * w. With ``weight=False`` this is SRMSNorm: x / (||x||_2 / sqrt(d))."""

    def __init__(self, dim: int, eps: float = 1e-6, weight: bool = True):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if weight else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if x.dtype in (torch.float32, torch.float64) and (w is None or w.dtype == x.dtype):
            return rms_norm(x, w, self.eps)
        # Low precision: PyTorch's own version, which accumulates in float32.
        return F.rms_norm(x, (self.dim,), w, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, weight={self.weight is not None}"


NORM_KINDS = ("rms", "srms", "layer")


def make_norm(kind: str, dim: int, eps: float) -> nn.Module:
    """"rms": RMSNorm with a weight; "srms": SRMSNorm (no weight); "layer": LayerNorm with a weight and a bias."""
    if kind == "rms":
        return RMSNorm(dim, eps, weight=True)
    if kind == "srms":
        return RMSNorm(dim, eps, weight=False)
    if kind == "layer":
        return nn.LayerNorm(dim, eps=eps)
    raise ValueError(f"unknown norm kind {kind!r}; valid choices are {NORM_KINDS}")
