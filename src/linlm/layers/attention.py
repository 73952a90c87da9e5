"""LLaMA's token mixer: softmax attention with RoPE through SDPA, decoding with a KV cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.errors import ShapeError
from linlm.ops.fused import rope_angles, rope_qkv


def document_mask(reset: torch.Tensor) -> torch.Tensor:
    """Boolean [B, 1, T, T] mask: causal and within the same document (documents start where reset is True)."""
    doc = torch.cumsum(reset.to(torch.int32), dim=1)
    same = doc[:, :, None] == doc[:, None, :]
    T = reset.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=reset.device).tril()
    return (same & causal)[:, None]


class Attention(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.head_dim
        self.rope_theta = cfg.rope_theta
        d = cfg.d_model
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        B, T, d = x.shape
        H, Dh = self.n_heads, self.head_dim
        qkv = self.qkv(x).view(B, T, 3, H, Dh)
        cos, sin = rope_angles(torch.arange(offset, offset + T, device=x.device), Dh, self.rope_theta, qkv.dtype)
        q, k, v = rope_qkv(qkv, cos, sin).unbind(0)
        if state is not None:
            k = torch.cat([state[0], k], dim=2)
            v = torch.cat([state[1], v], dim=2)
        if reset is not None:
            if state is not None:
                raise ShapeError("reset (packed documents) cannot be combined with a KV cache; decode each document separately")
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=document_mask(reset))
        elif state is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif T == 1:
            o = F.scaled_dot_product_attention(q, k, v)
        else:
            S = k.shape[2]
            mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=S - T)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = self.out(o.transpose(1, 2).reshape(B, T, d))
        return y, ((k, v) if return_state else None)

    def mixing_flops_per_token(self, seq_len: int) -> float:
        # Q K^T and A V over the causal context: position t attends to t keys, (n + 1) / 2 on average.
        # (The paper's formula counts the full n x n square, twice this.)
        return 2.0 * (seq_len + 1) * self.n_heads * self.head_dim
