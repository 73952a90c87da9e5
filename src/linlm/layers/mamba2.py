"""Mamba-2's token mixer: the SSD layer (arXiv 2405.21060, section 7), computed by the gated-linear-attention op.

For x of width d, inner width Din = expand * d, H = Din / P heads of P channels and G groups of B and C:

    (z, xBC, dt~) = in_proj(x)                   z in R^Din, xBC in R^(Din + 2 G N), dt~ in R^H
    (u, B, C)     = silu(causal depthwise conv1d(xBC))  u in R^Din, B and C in R^(G x N)
    dt_h          = softplus(dt~_h + dt_bias_h)          one step size per head
    h_t           = exp(dt_t A) h_{t-1} + dt_t B_t u_t^T       per head, h in R^(N x P), A = -exp(A_log) in R^H
    y_t           = h_t^T C_t + D u_t
    out           = out_proj(RMSNorm_G(y * silu(z)))     RMSNorm over each of G groups of Din / G channels

Head h reads group h // (H / G) of B and C. On the GLA op (ops/gla.py) this is q = C, k = B, v = dt * u and the
scalar gate log a = dt * A [B, T, H]: S_t = a_t S_{t-1} + k_t v_t^T, o_t = S_t^T q_t, with q and k passed per group
so that the op's chunk form computes each group's C B^T once (ops/ssd.py). On CUDA, mamba_ssm's SSD kernel
(``mamba_chunk_scan_combined``) takes the sequence where it is installed (``linlm.ops.backends``).

The parameter names and the fused projection's row order [z; x; B; C; dt] are those of transformers'
``Mamba2Mixer`` (and mamba_ssm's), so that their checkpoints map one to one. The decoding state is the conv's last
d_conv - 1 inputs and the SSM state [B, H, N, P]: constant in the context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers.linear_attention import gla_flops_per_token, gla_state_spec, run_gla
from linlm.layers.mamba import ShortConv, decay_rate, dt_bias_init_, output_gate
from linlm.layers.mixer import TokenMixer, float32_at_least
from linlm.layers.shell import computed
from linlm.ops import backends
from linlm.ops.fused import rms_norm

# A_h = -exp(A_log_h) with A_h drawn uniformly in [A_MIN, A_MAX]: Mamba-2's initialisation.
A_MIN, A_MAX = 1.0, 16.0
# The paper's channels per head.
PAPER_HEAD_DIM = 64


def mamba2_dims(cfg) -> tuple[int, int, int, int, int]:
    """(Din, H, P, G, N): inner width, heads, channels per head, groups, state size. ``options.head_dim`` 0 is
    the paper's P = 64 where it divides Din, else Din / n_heads."""
    o = cfg.options
    d_inner = o.expand * cfg.d_model
    p = o.head_dim or (PAPER_HEAD_DIM if d_inner % PAPER_HEAD_DIM == 0 else d_inner // cfg.n_heads)
    return d_inner, d_inner // p, p, o.n_groups, o.d_state


def run_ssd(u, dt, A, b, c, *, state, reset, return_state: bool, chunk_size: int):
    """The SSD recurrence (no D): on CUDA mamba_ssm's kernel where ``linlm.ops.backends.ssd`` takes the call (not
    a single decoding step), else the GLA op with q = C, k = B per group, v = dt u and log a = dt A (its chunk form
    computes each group's C B^T once: ops/ssd.py). u [B, T, H, P]; dt [B, T, H]; A [H]; b, c [B, T, G, N]."""
    if backends.on_gpu(u) and not (state is not None and u.shape[1] == 1 and reset is None):
        out = backends.ssd(u, dt, A, b, c, initial_state=state, reset=reset, output_final_state=return_state,
                           chunk_size=chunk_size)
        if out is not None:
            return out
    v = u * dt.unsqueeze(-1).to(u.dtype)
    return run_gla(c, b, v, dt * A, state=state, reset=reset, return_state=return_state, chunk_size=chunk_size)


class GroupRMSNorm(nn.Module):
    """RMSNorm with a weight, taken over each of ``groups`` equal slices of the last dimension (Mamba-2's norm
    before the output projection; one group is a plain RMSNorm)."""

    def __init__(self, dim: int, groups: int, eps: float):
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.to(float32_at_least(x.dtype)), self.weight
        if self.groups == 1:  # the fused norm (one pass each way)
            return rms_norm(h, w.to(h.dtype), self.eps).to(x.dtype)
        shape = h.shape
        h = rms_norm(h.reshape(*shape[:-1], self.groups, shape[-1] // self.groups), None, self.eps)
        return (h.reshape(shape) * w.to(h.dtype)).to(x.dtype)

    def flops_per_token(self, seq_len: int) -> float:
        return 4.0 * self.weight.numel()


class Mamba2Mixer(TokenMixer):
    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        d = cfg.d_model
        Din, H, P, G, N = mamba2_dims(cfg)
        self.d_inner, self.n_heads, self.head_dim, self.n_groups, self.d_state = Din, H, P, G, N
        self.chunk_size = cfg.chunk_size
        self.conv_dim = Din + 2 * G * N
        self.in_proj = nn.Linear(d, Din + self.conv_dim + H, bias=False)
        self.conv1d = ShortConv(self.conv_dim, cfg.options.d_conv, bias=True)
        self.dt_bias = nn.Parameter(dt_bias_init_(torch.empty(H)))
        self.A_log = nn.Parameter(computed((H,), lambda: torch.empty(H).uniform_(A_MIN, A_MAX).log()))
        self.D = nn.Parameter(torch.ones(H))
        self.norm = GroupRMSNorm(Din, G, cfg.norm_eps)
        self.out_proj = nn.Linear(Din, d, bias=False)

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        B_, T, _ = x.shape
        Din, H, P, G, N = self.d_inner, self.n_heads, self.head_dim, self.n_groups, self.d_state
        z, xbc, dt = self.in_proj(x).split([Din, self.conv_dim, H], dim=-1)
        xbc, conv_state = self.conv1d(xbc, None if state is None else state["conv"], reset, silu=True)
        u, b, c = xbc.split([Din, G * N, G * N], dim=-1)
        work = float32_at_least(dt.dtype)
        dt = F.softplus(dt.to(work) + self.dt_bias.to(work))  # [B, T, H]
        u = u.reshape(B_, T, H, P)
        o, ssm_state = run_ssd(u, dt, decay_rate(self.A_log), b.reshape(B_, T, G, N), c.reshape(B_, T, G, N),
                               state=None if state is None else state["ssm"], reset=reset, return_state=return_state,
                               chunk_size=self.chunk_size)
        y = torch.addcmul(o, u, self.D.to(u.dtype).view(H, 1))
        y = self.norm(output_gate(y.reshape(B_, T, Din), z))
        new_state = {"conv": conv_state, "ssm": ssm_state} if return_state else None
        return self.out_proj(y), new_state

    def mixing_flops_per_token(self, seq_len: int) -> float:
        # The recurrence, plus dt * u, the D skip and the silu gate (element-wise over Din).
        return (gla_flops_per_token(self.n_heads, self.d_state, self.head_dim, self.chunk_size, self.n_groups)
                + 6.0 * self.d_inner)

    def state_spec(self, batch: int, context: int, dtype: torch.dtype):
        """{"conv": the conv's last d_conv - 1 inputs [B, d_conv - 1, Din + 2 G N], "ssm": [B, H, N, P] in float32
        at least}."""
        return {"conv": self.conv1d.state_spec(batch, dtype),
                "ssm": gla_state_spec(batch, self.n_heads, self.d_state, self.head_dim, dtype)}
