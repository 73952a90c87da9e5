"""Gated linear units: SwiGLU (LLaMA, MossNet experts) and SGLU (TNL, HGRN2, cosFormer2)."""

from __future__ import annotations

import torch
from torch import nn

from linlm.ops.fused import glu


class GLU(nn.Module):
    """(act(x W_gate) * x W_up) W_down; ``act=None`` gives SGLU (no activation).

    The gate and up projections are fused into one matmul (``w_in`` holds [W_gate; W_up]); the product runs through
    ``ops.fused.glu``, whose gradient comes back as one tensor for ``w_in``.
    """

    def __init__(self, d_model: int, hidden: int, activation: str | None = "silu"):
        super().__init__()
        self.hidden = hidden
        self.activation = activation
        self.w_in = nn.Linear(d_model, 2 * hidden, bias=False)
        self.w_out = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_out(glu(self.w_in(x), self.activation))
