"""Pieces shared by the gated-linear-attention token mixers (TNL, HGRN2, cosFormer2, TPE)."""

from __future__ import annotations

import torch
from torch import nn

from linlm.layers.mixer import float32_at_least, meta
from linlm.ops.gla import gla, gla_step


def run_gla(q, k, v, log_a, *, state, reset, return_state: bool, chunk_size: int):
    """The sequence op (``linlm.ops.gla.gla``: the chunkwise form, or fla's kernels on CUDA) for prefill and
    training, the one-step form for single-token decoding.

    q, k: [B, T, H, K]; v: [B, T, H, V]; log_a: None, [H], [B, T, H] or [B, T, H, K].
    """
    if state is not None and q.shape[1] == 1 and reset is None:
        step_gate = log_a if log_a is None or log_a.dim() == 1 else log_a[:, 0]
        o, new_state = gla_step(q[:, 0], k[:, 0], v[:, 0], step_gate, state=state)
        return o[:, None], new_state
    return gla(
        q, k, v, log_a, initial_state=state, reset=reset, output_final_state=return_state, chunk_size=chunk_size
    )


def gla_flops_per_token(n_heads: int, k_dim: int, v_dim: int, chunk_size: int, groups: int = 0) -> float:
    """Forward FLOPs per token of the chunkwise form: intra-chunk scores (once per group where q and k are shared
    by ``groups`` groups of heads; 0: one per head) and mixing, plus state read and update."""
    return 2.0 * chunk_size * k_dim * (groups or n_heads) + n_heads * (2.0 * chunk_size * v_dim + 4.0 * k_dim * v_dim)


def gla_state_spec(batch: int, n_heads: int, k_dim: int, v_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """The state of :func:`run_gla`: [B, H, K, V], in float32 at least whatever the inputs' dtype."""
    return meta(batch, n_heads, k_dim, v_dim, dtype=float32_at_least(dtype))


class LowRankGate(nn.Module):
    """sigmoid(x W_down W_up) with W_down in R^{d x d/h}: the output gate of TNL and cosFormer2."""

    def __init__(self, d_model: int, rank: int):
        super().__init__()
        self.down = nn.Linear(d_model, rank, bias=False)
        self.up = nn.Linear(rank, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.up(self.down(x)))
