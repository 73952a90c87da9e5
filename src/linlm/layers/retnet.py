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
from torch import nn

from linlm.layers.linear_attention import gla_flops_per_token, gla_state_spec, run_gla
from linlm.layers.mamba import output_gate
from linlm.layers.mixer import TokenMixer, float32_at_least
from linlm.layers.norm import RMSNorm
from linlm.ops.fused import rope_reference


def retnet_log_decay(n_heads: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """log gamma_h = log(1 - 2^(-5 - h)), h = 0 .. H - 1 (the paper's multi-scale decays), [H]. Computed at each
    call (H numbers) in the compute dtype, not kept in a buffer: a float64 model then decays in float64."""
    h = torch.arange(n_heads, dtype=torch.float64)
    return torch.log1p(-torch.pow(2.0, -5.0 - h)).to(device=device, dtype=dtype)


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

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        B, T, _ = x.shape
        H, K, V = self.n_heads, self.k_dim, self.v_dim
        cos, sin = self._angles(offset, T, x)
        q = rope_reference(self.q_proj(x).view(B, T, H, K).transpose(1, 2), cos, sin).transpose(1, 2) * K ** -0.5
        k = rope_reference(self.k_proj(x).view(B, T, H, K).transpose(1, 2), cos, sin).transpose(1, 2)
        v = self.v_proj(x).view(B, T, H, V)
        log_decay = retnet_log_decay(H, float32_at_least(x.dtype), x.device)
        o, new_state = run_gla(q, k, v, log_decay, state=state, reset=reset, return_state=return_state,
                               chunk_size=self.chunk_size)
        y = output_gate(self.g_norm(o), self.g_proj(x).view(B, T, H, V))
        return self.o_proj(y.reshape(B, T, H * V)), new_state

    def _angles(self, offset, T: int, x: torch.Tensor):
        """cos and sin of positions offset .. offset + T - 1: [T, K / 2], or [B, 1, T, K / 2] with per-row offsets
        (a LongTensor [B]: a batch of sequences of different lengths). offset may be a 0-d tensor under export.
        RoPE's angles (ops.fused.rope_angles), in float32 at least so that a float64 model rotates in float64."""
        pos = torch.arange(T, device=x.device)
        if isinstance(offset, torch.Tensor) and offset.dim() == 1:
            pos = pos[None] + offset.to(x.device)[:, None]  # [B, T]
        else:
            pos = pos + offset
        work = float32_at_least(x.dtype)
        inv_freq = self.rope_theta ** (-torch.arange(0, self.k_dim, 2, dtype=torch.float64) / self.k_dim)
        angles = pos.to(work)[..., None] * inv_freq.to(x.device, work)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        return (cos, sin) if pos.dim() == 1 else (cos[:, None], sin[:, None])

    def mixing_flops_per_token(self, seq_len: int) -> float:
        # The recurrence, the rotations of q and k (3 per channel) and the silu output gate.
        H, K, V = self.n_heads, self.k_dim, self.v_dim
        return gla_flops_per_token(H, K, V, self.chunk_size) + H * (7.0 * K + 4.0 * V)

    def state_spec(self, batch: int, context: int, dtype: torch.dtype):
        return gla_state_spec(batch, self.n_heads, self.k_dim, self.v_dim, dtype)
