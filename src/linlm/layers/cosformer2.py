"""cosFormer2: linear attention with no decay, learnable per-channel LRPE, and a Toeplitz positional encoding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers.linear_attention import LowRankGate, gla_flops_per_token, gla_state_spec, run_gla
from linlm.layers.mixer import TokenMixer, float32_at_least
from linlm.layers.norm import RMSNorm
from linlm.layers.shell import computed


def lrpe_factors(theta: torch.Tensor, offset, T: int, dtype: torch.dtype) -> torch.Tensor:
    """[T, H, 2, K]: cos(theta t) and sin(theta t) for positions t = offset .. offset + T - 1; theta: [H, K].
    With per-row offsets (a LongTensor [B]: a batch of sequences of different lengths) it is [B, T, H, 2, K]."""
    # offset may be a 0-d tensor (an exported step takes the position as an input). The angles in float32 at least,
    # float64 in a float64 model (at position 1e5 a float32 angle is about 4e-3 off).
    work = float32_at_least(theta.dtype)
    t = torch.arange(T, device=theta.device, dtype=work)
    if isinstance(offset, torch.Tensor) and offset.dim() == 1:
        t = t[None] + offset.to(theta.device, work)[:, None]  # [B, T]
    else:
        t = t + offset
    angle = t[..., None, None] * theta.to(work)  # [(B,) T, H, K]
    return torch.stack([angle.cos(), angle.sin()], dim=-2).to(dtype)


def lrpe(x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """[x cos(theta t), x sin(theta t)] along the last dim: x [..., T, H, K] -> [..., T, H, 2K] in one product."""
    return (x.unsqueeze(-2) * factors).flatten(-2)


def frequencies(K: int) -> torch.Tensor:
    """10000^(-2i/K) for i < K."""
    return 10000.0 ** (-2.0 * torch.arange(K, dtype=torch.float32) / K)


class CosFormer2Mixer(TokenMixer):
    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        d, H, K = cfg.d_model, cfg.n_heads, cfg.head_dim
        self.n_heads, self.head_dim, self.chunk_size = H, K, cfg.chunk_size
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        # One learnable frequency per channel, initialised 10000^(-2i/K) within each head.
        self.theta = nn.Parameter(computed((H, K), lambda: frequencies(K).repeat(H, 1), dtype=torch.float32))
        self.gate = LowRankGate(d, K)
        self.norm = RMSNorm(d, cfg.norm_eps, weight=False)
        self.out = nn.Linear(d, d, bias=False)
        # The authors gate before the norm: Norm(o * gate) W_o. False is TNL's order, linlm's earlier choice.
        self.gate_before_norm = cfg.options.gate_before_norm

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        B, T, d = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim)
        # q and k together: silu, then one product with the position factors, shared by both.
        factors = lrpe_factors(self.theta, offset, T, qkv.dtype)
        factors = factors[:, None] if factors.dim() == 4 else factors[:, :, None]  # [(B,) T, 1, H, 2, K]
        q, k = lrpe(F.silu(qkv[:, :, :2]), factors).unbind(2)
        v = qkv[:, :, 2]
        o, new_state = run_gla(q, k, v, None, state=state, reset=reset, return_state=return_state, chunk_size=self.chunk_size)
        o, g = o.reshape(B, T, d), self.gate(x)
        y = self.norm(o * g) if self.gate_before_norm else self.norm(o) * g
        return self.out(y), new_state

    def mixing_flops_per_token(self, seq_len: int) -> float:
        return gla_flops_per_token(self.n_heads, 2 * self.head_dim, self.head_dim, self.chunk_size)

    def state_spec(self, batch: int, context: int, dtype: torch.dtype):
        # LRPE doubles the key: [x cos, x sin].
        return gla_state_spec(batch, self.n_heads, 2 * self.head_dim, self.head_dim, dtype)


class TPE(nn.Module):
    """Toeplitz positional encoding, applied once to the embeddings (reconstruction; see docs/architectures.md).

    A decayed linear-attention pass whose query and key are learnable vectors rather than projections
    of x: o_t = sum_{s<=t} lambda_h^{t-s} (q_h . k_h) x_s per head, normalised per head and added back to x.
    """

    def __init__(self, cfg):
        super().__init__()
        H, K = cfg.n_heads, cfg.head_dim
        self.n_heads, self.head_dim, self.chunk_size, self.eps = H, K, cfg.chunk_size, cfg.norm_eps
        self.q = nn.Parameter(computed((H, K), lambda: torch.randn(H, K) / K**0.5))
        self.k = nn.Parameter(computed((H, K), lambda: torch.randn(H, K) / K**0.5))
        self.decay_logit = nn.Parameter(computed((H,), lambda: torch.linspace(0.0, 4.0, H)))
        # The normalised output starts at the embeddings' scale.
        self.weight = nn.Parameter(torch.full((cfg.d_model,), cfg.init_std))

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False):
        B, T, d = x.shape
        H, K = self.n_heads, self.head_dim
        q = self.q.to(x.dtype).expand(B, T, H, K)
        k = self.k.to(x.dtype).expand(B, T, H, K)
        v = x.view(B, T, H, K)
        o, new_state = run_gla(
            q, k, v, F.logsigmoid(self.decay_logit.to(float32_at_least(self.decay_logit.dtype))),
            state=state, reset=reset, return_state=return_state, chunk_size=self.chunk_size,
        )
        o = F.rms_norm(o, (K,), eps=self.eps).reshape(B, T, d) * self.weight
        return x + o, new_state

    def state_spec(self, batch: int, context: int, dtype: torch.dtype):
        """Its decoding state (the model keeps it as ``ModelState.extra["embed"]``), as a mixer's state_spec."""
        return gla_state_spec(batch, self.n_heads, self.head_dim, self.head_dim, dtype)
