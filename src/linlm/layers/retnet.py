"""RetNet's token mixer: multi-scale retention (arXiv 2307.08621, section 2), a fixed decay per head.

Per head h, with key width K = d / H and value width V = expand_v * d / H:

    q_t = Rot_t(x W_q) K^-1/2,   k_t = Rot_t(x W_k),   v_t = x W_v      Rot_t: rotary position t
    gamma_h = 1 - 2^(-5 - h)                                              the paper's decays, h = 0 .. H - 1
    S_t = gamma_h S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t
    y = W_o (RMSNorm_head(o) * silu(x W_g))

which is the GLA op (ops/gla.py) with the constant [H] gate log gamma. The paper rotates q and k by xPos, a
rotation (its theta) with an extra exponential scaling; with the decay already in gamma the scaling is dropped
here, as flash-linear-attention's ``MultiScaleRetention`` drops it, and the rotation is RoPE's. The paper's
GroupNorm per head is the RMSNorm per head of fla; its parameter names (q_proj, k_proj, v_proj, g_proj, g_norm,
o_proj) are used here. Rotations are relative (q_t . k_s depends on t - s), so packed documents need no position
reset: the decay and the reset do the rest.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers.linear_attention import gla_flops_per_token, gla_state_spec, run_gla
from linlm.layers.mixer import TokenMixer
from linlm.layers.norm import RMSNorm
from linlm.ops.fused import rope_angles, rope_reference


def retnet_log_decay(n_heads: int) -> torch.Tensor:
    """log gamma_h = log(1 - 2^(-5 - h)), h = 0 .. H - 1 (the paper's multi-scale decays), float32 [H]."""
    h = torch.arange(n_heads, dtype=torch.float64)
    return torch.log1p(-torch.pow(2.0, -5.0 - h)).to(torch.float32)


class RetNetMixer(TokenMixer):
    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        d, H = cfg.d_model, cfg.n_heads
        vd = int(d * cfg.options.expand_v)
        self.n_heads, self.k_dim, self.v_dim = H, d // H, vd // H
        self.chunk_size, self.rope_theta = cfg.chunk_size, cfg.options.rope_theta
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, vd, bias=False)
        self.g_proj = nn.Linear(d, vd, bias=False)
        self.g_norm = RMSNorm(self.v_dim, cfg.norm_eps, weight=True)
        self.o_proj = nn.Linear(vd, d, bias=False)
        # Computed, not learned: a non-persistent buffer that init_buffers() fills.
        self.register_buffer("log_decay", torch.empty(H), persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        with torch.no_grad():
            self.log_decay = retnet_log_decay(self.n_heads).to(self.log_decay.device)

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        B, T, _ = x.shape
        H, K, V = self.n_heads, self.k_dim, self.v_dim
        cos, sin = rope_angles(torch.arange(T, device=x.device) + offset, K, self.rope_theta, x.dtype)
        q = rope_reference(self.q_proj(x).view(B, T, H, K).transpose(1, 2), cos, sin).transpose(1, 2) * K ** -0.5
        k = rope_reference(self.k_proj(x).view(B, T, H, K).transpose(1, 2), cos, sin).transpose(1, 2)
        v = self.v_proj(x).view(B, T, H, V)
        o, new_state = run_gla(q, k, v, self.log_decay, state=state, reset=reset, return_state=return_state,
                               chunk_size=self.chunk_size)
        y = self.g_norm(o) * F.silu(self.g_proj(x)).view(B, T, H, V)
        return self.o_proj(y.reshape(B, T, H * V)), new_state

    def mixing_flops_per_token(self, seq_len: int) -> float:
        # The recurrence, the rotations of q and k (3 per channel) and the silu output gate.
        H, K, V = self.n_heads, self.k_dim, self.v_dim
        return gla_flops_per_token(H, K, V, self.chunk_size) + H * (7.0 * K + 4.0 * V)

    def state_spec(self, batch: int, context: int, dtype: torch.dtype):
        return gla_state_spec(batch, self.n_heads, self.k_dim, self.v_dim, dtype)
