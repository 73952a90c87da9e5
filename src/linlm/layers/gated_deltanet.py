"""Gated DeltaNet's token mixer (arXiv 2412.06464): DeltaNet's layer (layers/deltanet.py) with Mamba-2's decay.

For x of width d, H heads of key width K (options.head_k_dim; 0: 3/4 d / H, so that q and k take 3/4 d each, the
paper's allocation) and value width V = expand_v K (2 by default: 3/2 d in all). With options.v_heads = Hv > H
(fla's num_v_heads, Qwen3-Next's linear_num_value_heads) there are Hv value heads, each with its own gates, state
and output gate, and value head h reads q and k head h // (Hv / H):

    (q, k, v, g, a, b) = x [W_q; W_k; W_v; W_g; W_a; W_b]
    (q, k, v) = silu(causal depthwise conv(q, k, v))                         kernel 4, no bias
    log a_t   = -exp(A_log) softplus(a + dt_bias)                            one per head, Mamba-2's gate
    beta      = sigmoid(b)                                                   2 sigmoid(b) with options.neg_eigval
    o         = delta_rule(q / |q| * K^-1/2, k / |k|, v, beta, log a)
    y         = W_o (RMSNorm_V(o) * silu(g))                                 the output gate after a per-head norm

as the authors' library (flash-linear-attention's GatedDeltaNet, whose defaults these are) builds it. A_log and
dt_bias are plain parameters (the model's Linear init leaves them alone): A = exp(A_log) uniform in [1, 16] at
init, dt_bias the inverse softplus of dt log-uniform in [1e-3, 1e-1] (Mamba's dt init).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers.deltanet import DeltaRuleMixer, at_least_float32
from linlm.layers.mamba import dt_bias_init_, output_gate
from linlm.layers.shell import computed

A_INIT = (1.0, 16.0)  # A = exp(A_log) uniform in this range at init


def head_k_dim(cfg) -> int:
    """options.head_k_dim, or 3/4 d / n_heads when it is 0 (at least 1)."""
    return cfg.options.head_k_dim or max(1, (3 * cfg.d_model) // (4 * cfg.n_heads))


def head_v_dim(cfg) -> int:
    return int(round(head_k_dim(cfg) * cfg.options.expand_v))


class GatedDeltaNetMixer(DeltaRuleMixer):
    def __init__(self, cfg, layer_idx: int):
        Hk, K, V = cfg.n_heads, head_k_dim(cfg), head_v_dim(cfg)
        H = cfg.options.v_heads or Hk
        super().__init__(cfg, H, K, V, extra=H * V + 2 * H, conv=cfg.options.short_conv, k_heads=Hk)
        self.beta_scale = 2.0 if cfg.options.neg_eigval else 1.0
        self.A_log = nn.Parameter(computed((H,), lambda: torch.empty(H).uniform_(*A_INIT).log()))
        self.dt_bias = nn.Parameter(dt_bias_init_(torch.empty(H)))

    def gates(self, rest):
        H = self.n_heads
        a, b = at_least_float32(rest[..., -2 * H:]).split([H, H], dim=-1)
        log_a = -torch.exp(at_least_float32(self.A_log)) * F.softplus(a + at_least_float32(self.dt_bias))
        beta = torch.sigmoid(b)
        return (beta * self.beta_scale if self.beta_scale != 1.0 else beta), log_a

    def finish(self, o, rest):
        g = rest[..., : self.n_heads * self.v_dim].reshape(o.shape)
        return output_gate(self.norm(o), g)
