"""DeltaNet's token mixer (arXiv 2406.06484), and the pieces Gated DeltaNet's (layers/gated_deltanet.py) shares.

For x of width d, H heads of key width K = d / H and value width V = d / H:

    (q, k, v, b) = x [W_q; W_k; W_v; W_b]
    (q, k, v)    = silu(causal depthwise conv(q, k, v))        kernel 4, no bias (one conv over all three)
    beta         = sigmoid(b)                                  one per head; 2 sigmoid(b) with options.neg_eigval
    o            = delta_rule(q / |q| * K^-1/2, k / |k|, v, beta)
    y            = W_o RMSNorm_V(o)                            a norm over each head's V values, with a weight

which is the paper's layer as its authors' library (flash-linear-attention's DeltaNet, whose defaults these are)
builds it: short convolutions, SiLU then L2 normalisation of q and k, a sigmoid beta, a per-head output norm.
The L2 normalisation happens inside the op (qk_l2norm: x / sqrt(sum x^2 + 1e-6)), so that keys are unit and the
recurrence stable whatever the projections learn (linlm.ops.delta_rule, "Numerical conditions").

The decoding state is the conv's last 3 inputs [B, 3, 2 H K + H V] and the delta-rule state [B, H, K, V]: constant
in the context length. Packed sequences are exact: the conv drops taps across a document start, the op discards
its state there.
"""

from __future__ import annotations

import torch
from torch import nn

from linlm.layers.mamba import ShortConv
from linlm.layers.mixer import TokenMixer, float32_at_least, meta
from linlm.layers.norm import RMSNorm
from linlm.ops.delta_chunk import chunk_length
from linlm.ops.delta_rule import delta_rule, delta_rule_step


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """t in float32, or float64 where it is float64: the gates are computed in at least float32."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def run_delta_rule(q, k, v, beta, log_a, *, state, reset, return_state: bool, chunk_size: int, scale: float):
    """The sequence op (``linlm.ops.delta_rule.delta_rule``: the chunk form, or fla's kernels on CUDA) for prefill
    and training, the one-step form for single-token decoding. q, k: [B, T, H, K] (normalised inside); v:
    [B, T, H, V]; beta, log_a: None or [B, T, H]."""
    if state is not None and q.shape[1] == 1 and reset is None:
        o, new_state = delta_rule_step(q[:, 0], k[:, 0], v[:, 0], None if beta is None else beta[:, 0],
                                       None if log_a is None else log_a[:, 0], state=state, scale=scale,
                                       qk_l2norm=True)
        return o[:, None], new_state
    return delta_rule(q, k, v, beta, log_a, initial_state=state, reset=reset, output_final_state=return_state,
                      scale=scale, qk_l2norm=True, chunk_size=chunk_size)


def delta_flops_per_token(n_heads: int, k_dim: int, v_dim: int, chunk_size: int, seq_len: int) -> float:
    """Forward FLOPs per token of the chunk form's matmuls (linlm.ops.delta_chunk), on a chunk of C steps:
    q k^T and k k^T (2 C K), the UT transform by doubling (sum over levels h of C h^2 per chunk), U and W (C V + C K),
    the pass over chunks W S and (K e)^T u (2 K V), the outputs (Q e) S and scores u (K V + C V); 2 FLOPs a MAC."""
    C = chunk_length(chunk_size, max(seq_len, 1))
    inverse = sum(C * h * h for h in _doubling_levels(C)) / C
    macs = 3 * C * k_dim + 2 * C * v_dim + inverse + 3 * k_dim * v_dim
    return 2.0 * n_heads * macs


def _doubling_levels(C: int):
    """The block sizes h of the UT transform's levels that use matmuls (h >= 2; level 1 is a negation)."""
    h = 2
    while h < C:
        yield h
        h *= 2


class DeltaRuleMixer(TokenMixer):
    """What DeltaNet and Gated DeltaNet share: a fused projection whose first 2 Hk K + H V outputs are q, k, v
    (the rest the subclass's own), one short conv + SiLU over q, k, v, the op, a per-head output norm and W_o. A
    subclass sets ``extra`` (the projection's further outputs) and defines ``gates(rest)`` -> (beta, log_a) and
    ``finish(o, rest)`` -> the normed output.

    H value heads (``n_heads``) may share Hk = ``k_heads`` heads of q and k (Hk dividing H): head h reads q and k
    head h // (H / Hk), as fla's num_v_heads and Qwen3-Next's linear layers do. The op then runs on H heads."""

    def __init__(self, cfg, n_heads: int, k_dim: int, v_dim: int, extra: int, conv: int, k_heads: int = 0):
        super().__init__(cfg, 0)
        d = cfg.d_model
        self.n_heads, self.k_dim, self.v_dim, self.chunk_size = n_heads, k_dim, v_dim, cfg.chunk_size
        self.k_heads = k_heads or n_heads
        self.qkv_width = 2 * self.k_heads * k_dim + n_heads * v_dim
        self.proj = nn.Linear(d, self.qkv_width + extra, bias=False)
        self.conv = ShortConv(self.qkv_width, conv, bias=False) if conv else None
        self.norm = RMSNorm(v_dim, cfg.norm_eps, weight=True)
        self.out = nn.Linear(n_heads * v_dim, d, bias=False)

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        B, T, _ = x.shape
        H, Hk, K, V = self.n_heads, self.k_heads, self.k_dim, self.v_dim
        qkv, rest = self.proj(x).split([self.qkv_width, self.proj.out_features - self.qkv_width], dim=-1)
        conv_state = None
        if self.conv is not None:
            qkv, conv_state = self.conv(qkv, None if state is None else state["conv"], reset, silu=True)
        else:
            qkv = torch.nn.functional.silu(qkv)
        q, k, v = qkv.split([Hk * K, Hk * K, H * V], dim=-1)
        q, k = q.view(B, T, Hk, K), k.view(B, T, Hk, K)
        if Hk != H:
            q, k = q.repeat_interleave(H // Hk, dim=2), k.repeat_interleave(H // Hk, dim=2)
        beta, log_a = self.gates(rest)
        o, s = run_delta_rule(q, k, v.reshape(B, T, H, V), beta, log_a,
                              state=None if state is None else state["delta"], reset=reset,
                              return_state=return_state, chunk_size=self.chunk_size, scale=K**-0.5)
        y = self.out(self.finish(o, rest).reshape(B, T, H * V))
        if not return_state:
            return y, None
        return y, ({"delta": s} if self.conv is None else {"conv": conv_state, "delta": s})

    def state_spec(self, batch: int, context: int, dtype: torch.dtype):
        """{"conv": the conv's last inputs [B, kernel - 1, 2 Hk K + H V] (absent without a conv), "delta": the
        delta-rule state [B, H, K, V] in float32 at least}: constant in the context."""
        spec = {"delta": meta(batch, self.n_heads, self.k_dim, self.v_dim, dtype=float32_at_least(dtype))}
        return spec if self.conv is None else {"conv": self.conv.state_spec(batch, dtype), **spec}

    def mixing_flops_per_token(self, seq_len: int) -> float:
        # the projections, the conv and the norm are counted by the walk over the children
        return delta_flops_per_token(self.n_heads, self.k_dim, self.v_dim, self.chunk_size, seq_len)


class DeltaNetMixer(DeltaRuleMixer):
    def __init__(self, cfg, layer_idx: int):
        H = cfg.n_heads
        super().__init__(cfg, H, cfg.head_dim, cfg.head_dim, extra=H, conv=cfg.options.short_conv)
        self.beta_scale = 2.0 if cfg.options.neg_eigval else 1.0

    def gates(self, b):
        beta = torch.sigmoid(at_least_float32(b))
        return (beta * self.beta_scale if self.beta_scale != 1.0 else beta), None

    def finish(self, o, rest):
        return self.norm(o)
