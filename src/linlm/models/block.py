"""The residual block every architecture shares: x = x + mixer(norm(x)); x = x + mlp(norm(x)).

In a hybrid stack (ModelConfig.attn_layers or attn_every) the named layers' mixer is softmax attention
(layers/hybrid.py), with the architecture's MLP, or SwiGLU for an architecture without one (Mamba's, Mamba-2's)."""

from __future__ import annotations

import dataclasses

from torch import nn

from linlm.layers.glu import GLU
from linlm.layers.hybrid import HybridAttention
from linlm.layers.norm import make_norm


def attention_config(cfg):
    """The config a hybrid's attention layer is built from: cfg's shape with ``cfg.attn_options`` as LLaMA's
    options (None: their defaults, RoPE base 10000 and as many KV heads as heads)."""
    return dataclasses.replace(cfg, arch="llama", options=cfg.attn_options)


class Block(nn.Module):
    """x = x + mixer(norm(x)); x = x + mlp(norm(x)). ``spec`` (an ArchSpec) gives the mixer, the MLP and the norm."""

    def __init__(self, cfg, layer_idx: int, spec):
        super().__init__()
        norm = spec.norm_kind(cfg)
        self.norm1 = make_norm(norm, cfg.d_model, cfg.norm_eps)
        if layer_idx in cfg.attention_layers:  # a hybrid stack's attention layer (ModelConfig.attn_layers)
            self.mixer = HybridAttention(attention_config(cfg), layer_idx)
            self.mlp = (spec.mlp(cfg, layer_idx) if spec.mlp is not None
                        else GLU(cfg.d_model, cfg.glu_hidden, activation="silu"))
        else:
            self.mixer = spec.mixer(cfg, layer_idx)
            self.mlp = spec.mlp(cfg, layer_idx) if spec.mlp is not None else None
        self.norm2 = make_norm(norm, cfg.d_model, cfg.norm_eps) if self.mlp is not None else None

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        out = self.mixer(self.norm1(x), state=state, reset=reset, offset=offset, return_state=return_state, ctx=ctx)
        h, new_state, aux = out if len(out) == 3 else (*out, None)
        x = x + h
        if self.mlp is not None:
            m = self.mlp(self.norm2(x))
            if isinstance(m, tuple):
                m, mlp_aux = m
                aux = mlp_aux if aux is None else aux + mlp_aux
            x = x + m
        return x, new_state, aux
