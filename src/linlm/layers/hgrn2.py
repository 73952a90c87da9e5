"""HGRN2's token mixer: gated linear attention with a data-dependent gate over the key channels.

f_t = lb_l + (1 - lb_l) * sigmoid(x W_f) is the forget gate; the key is 1 - f_t and the query is
f(x W_q). The lower bound lb_l grows with depth and comes from a table shared by all layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers.linear_attention import gla_flops_per_token, run_gla
from linlm.layers.norm import RMSNorm

# Below this the lower bound only guards log(0); it changes the gate by at most 1e-30.
_LB_FLOOR = 1e-30


class LowerBounds(nn.Module):
    """lb = cumsum(softmax(LB, dim=layers)) minus its first row: [L, d], 0 for layer 0, increasing with depth."""

    def __init__(self, cfg):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(cfg.n_layers, cfg.d_model))

    def forward(self) -> torch.Tensor:
        c = torch.cumsum(torch.softmax(self.table.float(), dim=0), dim=0)
        return c - c[:1]


class HGRN2Mixer(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        d, H = cfg.d_model, cfg.n_heads
        self.layer_idx = layer_idx
        self.n_heads, self.head_dim, self.chunk_size = H, cfg.head_dim, cfg.chunk_size
        self.proj = nn.Linear(d, 3 * d, bias=False)  # [W_q; W_f; W_h]
        self.norm = RMSNorm(d, cfg.norm_eps, weight=False)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        B, T, d = x.shape
        H, K = self.n_heads, self.head_dim
        q, f, v = self.proj(x).view(B, T, 3, H, K).unbind(2)
        lb = ctx[self.layer_idx].view(H, K)
        # log f_t = log(lb + (1 - lb) sigmoid(z)), evaluated without forming a tiny f_t.
        log_a = torch.logaddexp(torch.log(lb.clamp_min(_LB_FLOOR)), torch.log1p(-lb) + F.logsigmoid(f.float()))
        k = ((1.0 - lb) * torch.sigmoid(-f.float())).to(v.dtype)
        o, new_state = run_gla(
            F.silu(q), k, v, log_a, state=state, reset=reset, return_state=return_state, chunk_size=self.chunk_size
        )
        return self.out(self.norm(o.reshape(B, T, d))), new_state

    def mixing_flops_per_token(self, seq_len: int) -> float:
        return gla_flops_per_token(self.n_heads, self.head_dim, self.head_dim, self.chunk_size)
