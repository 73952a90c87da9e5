"""TNL's token mixer: linear attention with a constant decay per head and layer."""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers.linear_attention import LowRankGate, gla_flops_per_token, run_gla
from linlm.layers.norm import RMSNorm


def tnl_log_decay(n_heads: int, layer_idx: int, n_layers: int) -> torch.Tensor:
    """log lambda_{h,l} = -s_h (1 - l/(L-1) + 1e-5), s_h = 2^(-8(h+1)/H), following the authors' code."""
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / n_heads) for h in range(n_heads)], dtype=torch.float64)
    depth = layer_idx / max(n_layers - 1, 1)
    return (-slopes * (1.0 - depth + 1e-5)).to(torch.float32)


class TNLMixer(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        d, H = cfg.d_model, cfg.n_heads
        self.n_heads, self.head_dim, self.chunk_size = H, cfg.head_dim, cfg.chunk_size
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.gate = LowRankGate(d, cfg.head_dim)
        self.norm = RMSNorm(d, cfg.norm_eps, weight=False)
        self.out = nn.Linear(d, d, bias=False)
        self.register_buffer("log_decay", tnl_log_decay(H, layer_idx, cfg.n_layers), persistent=False)

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).unbind(2)
        o, new_state = run_gla(
            F.silu(q), F.silu(k), v, self.log_decay,
            state=state, reset=reset, return_state=return_state, chunk_size=self.chunk_size,
        )
        y = self.out(self.norm(o.reshape(B, T, d)) * self.gate(x))
        return y, new_state

    def mixing_flops_per_token(self, seq_len: int) -> float:
        return gla_flops_per_token(self.n_heads, self.head_dim, self.head_dim, self.chunk_size)

    @staticmethod
    def state_shape(cfg) -> tuple[int, ...]:
        return (cfg.n_heads, cfg.head_dim, cfg.head_dim)


