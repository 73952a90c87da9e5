"""TNL's token mixer: linear attention with a constant decay per head and layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers.linear_attention import LowRankGate, gla_flops_per_token, gla_state_spec, run_gla
from linlm.layers.mixer import TokenMixer
from linlm.layers.norm import RMSNorm


SLOPE_RULES = ("alibi", "pow2")


def _pow2_slopes(n: int) -> list[float]:
    """s_h = 2^(-8 (h+1) / n) for h = 0..n-1: the ALiBi set when n is a power of two."""
    return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]


def tnl_slopes(n_heads: int, rule: str = "alibi") -> list[float]:
    """The per-head decay rates s_h.

    ``"alibi"`` builds them as the authors' code builds ALiBi slopes: for H a power of two, 2^(-8 (h+1) / H);
    otherwise, with n = 2^floor(log2 H), the n slopes of the power-of-two set for n, followed by the first H - n
    entries of every other slope (indices 0, 2, 4, ...) of the set for 2n. ``"pow2"`` applies 2^(-8 (h+1) / H)
    to every H (what linlm did before, kept so that models saved then compute what they computed).
    """
    if rule == "pow2":
        return _pow2_slopes(n_heads)
    if rule != "alibi":
        raise ValueError(f"unknown slope rule {rule!r}; valid choices are {SLOPE_RULES}")
    n = 1 << (n_heads.bit_length() - 1)
    if n == n_heads:
        return _pow2_slopes(n)
    return _pow2_slopes(n) + _pow2_slopes(2 * n)[0::2][: n_heads - n]


def tnl_log_decay(n_heads: int, layer_idx: int, n_layers: int, rule: str = "alibi") -> torch.Tensor:
    """log lambda_{h,l} = -s_h (1 - l/(L-1) + 1e-5), with s_h from :func:`tnl_slopes`, following the authors' code;
    on the CPU, for the caller to move (arithmetic on the meta device would import torch._dynamo)."""
    slopes = torch.tensor(tnl_slopes(n_heads, rule), dtype=torch.float64, device="cpu")
    depth = layer_idx / max(n_layers - 1, 1)
    return (-slopes * (1.0 - depth + 1e-5)).to(torch.float32)


class TNLMixer(TokenMixer):
    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        d, H = cfg.d_model, cfg.n_heads
        self.n_heads, self.head_dim, self.chunk_size = H, cfg.head_dim, cfg.chunk_size
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.gate = LowRankGate(d, cfg.head_dim)
        self.norm = RMSNorm(d, cfg.norm_eps, weight=False)
        self.out = nn.Linear(d, d, bias=False)
        # The authors apply SiLU to v as well as to q and k; options.v_silu=False is linlm's earlier v (no activation).
        self.v_silu = cfg.options.v_silu
        # The decays are computed, not learned: a non-persistent buffer that init_buffers() fills.
        self.layer_idx, self.n_layers, self.slopes = layer_idx, cfg.n_layers, cfg.options.slopes
        self.register_buffer("log_decay", torch.empty(H), persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        with torch.no_grad():
            decay = tnl_log_decay(self.n_heads, self.layer_idx, self.n_layers, self.slopes)
            self.log_decay = decay.to(self.log_decay.device)

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).unbind(2)
        o, new_state = run_gla(
            F.silu(q), F.silu(k), F.silu(v) if self.v_silu else v, self.log_decay,
            state=state, reset=reset, return_state=return_state, chunk_size=self.chunk_size,
        )
        y = self.out(self.norm(o.reshape(B, T, d)) * self.gate(x))
        return y, new_state

    def mixing_flops_per_token(self, seq_len: int) -> float:
        return gla_flops_per_token(self.n_heads, self.head_dim, self.head_dim, self.chunk_size)

    def state_spec(self, batch: int, context: int, dtype: torch.dtype):
        return gla_state_spec(batch, self.n_heads, self.head_dim, self.head_dim, dtype)
