"""HGRN2's token mixer: gated linear attention with a data-dependent gate over the key channels.

f_t = lb_l + (1 - lb_l) * sigmoid(x W_f) is the forget gate; the key is 1 - f_t and the query is
f(x W_q). The lower bound lb_l grows with depth and comes from a table shared by all layers.

The options (``cfg.options``, models/archs/hgrn2.py) turn on the variants of flash-linear-attention's HGRN2, so that
its checkpoints compute here what they compute there: no lower bound, q scaled by head_dim^-1/2 (fla's kernels'
default), a weight on the output norm, causal depthwise convolutions on q, f and v (no bias, no activation). Their
defaults are the paper's model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers.linear_attention import gla_flops_per_token, gla_state_spec, run_gla
from linlm.layers.mamba import ShortConv
from linlm.layers.mixer import TokenMixer, float32_at_least
from linlm.layers.norm import RMSNorm

# Below this the lower bound only guards log(0); it changes the gate by at most 1e-30.
_LB_FLOOR = 1e-30
# The projections that a short convolution follows, in the order of the fused projection [W_q; W_f; W_h].
CONV_STREAMS = ("q", "f", "v")


class LowerBounds(nn.Module):
    """lb = cumsum(softmax(LB, dim=layers)) minus its first row: [L, d], 0 for layer 0, increasing with depth."""

    def __init__(self, cfg):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(cfg.n_layers, cfg.d_model))

    def forward(self) -> torch.Tensor:
        c = torch.cumsum(torch.softmax(self.table.to(float32_at_least(self.table.dtype)), dim=0), dim=0)
        return c - c[:1]


def lower_bounds(cfg):
    """The shared lower-bound table, or None when ``options.lower_bound`` is off (then every gate is sigmoid(z))."""
    return LowerBounds(cfg) if cfg.options.lower_bound else None


class HGRN2Mixer(TokenMixer):
    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        d, H = cfg.d_model, cfg.n_heads
        opts = cfg.options
        self.layer_idx = layer_idx
        self.n_heads, self.head_dim, self.chunk_size = H, cfg.head_dim, cfg.chunk_size
        self.q_scale = cfg.head_dim ** -0.5 if opts.q_scale else None
        self.proj = nn.Linear(d, 3 * d, bias=False)  # [W_q; W_f; W_h]
        self.conv = (nn.ModuleDict({s: ShortConv(d, opts.short_conv, bias=False) for s in CONV_STREAMS})
                     if opts.short_conv else None)
        self.norm = RMSNorm(d, cfg.norm_eps, weight=opts.out_norm_weight)
        self.out = nn.Linear(d, d, bias=False)

    def _convolve(self, qfv, state, reset):
        """q, f, v through their short convolutions, and their new conv states."""
        out, states = [], {}
        for name, x in zip(CONV_STREAMS, qfv):
            y, states[name] = self.conv[name](x, None if state is None else state[name], reset)
            out.append(y)
        return out, states

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        B, T, d = x.shape
        H, K = self.n_heads, self.head_dim
        qfv = self.proj(x).chunk(3, dim=-1)
        conv_states = None
        if self.conv is not None:
            qfv, conv_states = self._convolve(qfv, None if state is None else state["conv"], reset)
        q, f, v = (t.reshape(B, T, H, K) for t in qfv)
        f = f.to(float32_at_least(f.dtype))  # the gates in float32 at least (float64 in a float64 model)
        if ctx is None:
            log_a, k = F.logsigmoid(f), torch.sigmoid(-f).to(v.dtype)
        else:
            lb = ctx[self.layer_idx].view(H, K)
            # log f_t = log(lb + (1 - lb) sigmoid(z)), evaluated without forming a tiny f_t.
            log_a = torch.logaddexp(torch.log(lb.clamp_min(_LB_FLOOR)), torch.log1p(-lb) + F.logsigmoid(f))
            k = ((1.0 - lb) * torch.sigmoid(-f)).to(v.dtype)
        q = F.silu(q) if self.q_scale is None else F.silu(q) * self.q_scale
        gla_state = state if conv_states is None or state is None else state["gla"]
        o, new_state = run_gla(q, k, v, log_a, state=gla_state, reset=reset, return_state=return_state,
                               chunk_size=self.chunk_size)
        if conv_states is not None and return_state:
            new_state = {"conv": conv_states, "gla": new_state}
        return self.out(self.norm(o.reshape(B, T, d))), new_state

    def mixing_flops_per_token(self, seq_len: int) -> float:
        return gla_flops_per_token(self.n_heads, self.head_dim, self.head_dim, self.chunk_size)

    def state_spec(self, batch: int, context: int, dtype: torch.dtype):
        """The recurrence's state [B, H, K, K]; with short convolutions {"conv": {q, f, v: their windows},
        "gla": that state}."""
        gla = gla_state_spec(batch, self.n_heads, self.head_dim, self.head_dim, dtype)
        if self.conv is None:
            return gla
        return {"conv": {s: self.conv[s].state_spec(batch, dtype) for s in CONV_STREAMS}, "gla": gla}
