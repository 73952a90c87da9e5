"""GLA's token mixer: gated linear attention with a data-dependent vector gate from a low-rank projection
(arXiv 2312.06635, section 4.4).

Per head, with key width K = expand_k * d / H and value width V = expand_v * d / H:

    q_t = x W_q,  k_t = x W_k,  v_t = x W_v
    log a_t = logsigmoid(x W_a1 W_a2 + b_a) / tau         a vector over the K key channels; tau = 16 in the paper
    S_t = Diag(a_t) S_{t-1} + k_t v_t^T,   o_t = S_t^T (q_t K^-1/2)
    y = W_o (RMSNorm_head(o) * silu(x W_r))               the norm per head, with a weight

which is the GLA op (ops/gla.py) with the [B, T, H, K] vector gate. The paper writes the gate as
sigmoid(...)^(1/tau) and the output norm as a LayerNorm; the RMSNorm and the K^-1/2 scaling of q are those of
flash-linear-attention's ``GatedLinearAttention``, whose parameter names (q_proj, k_proj, v_proj, g_proj,
gk_proj, g_norm, o_proj) are used here so that its checkpoints map one to one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers.linear_attention import gla_flops_per_token, gla_state_spec, run_gla
from linlm.layers.mamba import output_gate
from linlm.layers.mixer import TokenMixer, float32_at_least
from linlm.layers.norm import RMSNorm


def gla_dims(cfg) -> tuple[int, int]:
    """(key width, value width) of all heads together."""
    o = cfg.options
    return int(cfg.d_model * o.expand_k), int(cfg.d_model * o.expand_v)


class LowRankLogGate(nn.Module):
    """logsigmoid(x W_1 W_2 + b) / tau: GLA's vector forget gate, in log space and float32 at least."""

    def __init__(self, d_model: int, rank: int, width: int, tau: float):
        super().__init__()
        self.down = nn.Linear(d_model, rank, bias=False)
        self.up = nn.Linear(rank, width, bias=True)
        self.tau = tau

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.up(self.down(x))
        return F.logsigmoid(z.to(float32_at_least(z.dtype))) / self.tau


class GLAMixer(TokenMixer):
    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        d, H, o = cfg.d_model, cfg.n_heads, cfg.options
        kd, vd = gla_dims(cfg)
        self.n_heads, self.k_dim, self.v_dim = H, kd // H, vd // H
        self.chunk_size = cfg.chunk_size
        self.q_proj = nn.Linear(d, kd, bias=False)
        self.k_proj = nn.Linear(d, kd, bias=False)
        self.v_proj = nn.Linear(d, vd, bias=False)
        self.g_proj = nn.Linear(d, vd, bias=False)
        self.gk_proj = LowRankLogGate(d, o.gate_rank, kd, o.gate_tau)
        self.g_norm = RMSNorm(self.v_dim, cfg.norm_eps, weight=True)
        self.o_proj = nn.Linear(vd, d, bias=False)

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        B, T, _ = x.shape
        H, K, V = self.n_heads, self.k_dim, self.v_dim
        q = self.q_proj(x).view(B, T, H, K) * K ** -0.5
        k = self.k_proj(x).view(B, T, H, K)
        v = self.v_proj(x).view(B, T, H, V)
        log_a = self.gk_proj(x).view(B, T, H, K)
        o, new_state = run_gla(q, k, v, log_a, state=state, reset=reset, return_state=return_state,
                               chunk_size=self.chunk_size)
        y = output_gate(self.g_norm(o), self.g_proj(x).view(B, T, H, V))
        return self.o_proj(y.reshape(B, T, H * V)), new_state

    def mixing_flops_per_token(self, seq_len: int) -> float:
        # The recurrence, the scaling of q, the gate's logsigmoid and the silu output gate.
        H, K, V = self.n_heads, self.k_dim, self.v_dim
        return gla_flops_per_token(H, K, V, self.chunk_size) + H * (3.0 * K + 4.0 * V)

    def state_spec(self, batch: int, context: int, dtype: torch.dtype):
        return gla_state_spec(batch, self.n_heads, self.k_dim, self.v_dim, dtype)
