"""The attention layers of a hybrid stack: LLaMA's softmax attention (layers/attention.py), full or in a sliding
window.

A hybrid (ModelConfig.attn_layers or attn_every) puts these among a linear architecture's own mixers, as
MiniMax-01, Jamba, Nemotron-H and Qwen3-Next do. Decoding keeps a KV cache only at these layers; the linear layers
keep their constant states.

With a window W (``cfg.attn_window``), the token at position t attends to positions t - W + 1 .. t (itself and the
W - 1 before it, within its document), and the cache holds only the last W - 1 keys and values: a state bounded by
the window whatever the context, which ``state_spec`` (and so ``ModelState.nbytes``) says. With W at least the
sequence's length this is full causal attention.
"""

from __future__ import annotations

import torch

from linlm.errors import ShapeError
from linlm.layers.attention import Attention, sdpa, document_mask
from linlm.layers.mixer import meta


def window_flops_factor(seq_len: int, window: int | None) -> float:
    """The average number of keys a token attends to over a sequence of ``seq_len``: (n + 1) / 2 for full causal
    attention, sum_t min(t, W) / n in a window of W."""
    n = seq_len
    if window is None or window >= n:
        return (n + 1) / 2
    return (window * (window + 1) / 2 + (n - window) * window) / n


class HybridAttention(Attention):
    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.window = cfg.attn_window  # None: full attention

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        """The state is the cache (k, v), [B, Hkv, S, Dh] each, S <= window - 1, or (k, v, key_valid) after a packed
        prefill (key_valid [B, S]: False at keys of earlier documents), as for Attention."""
        if self.window is None:
            return super().forward(x, state=state, reset=reset, offset=offset, return_state=return_state)
        B, T, d = x.shape
        q, k, v, gate = self._project(x, offset)
        cached, key_valid = 0, None
        if state is not None:
            cached = state[0].shape[2]
            k, v = torch.cat([state[0], k], dim=2), torch.cat([state[1], v], dim=2)
            if len(state) == 3:
                key_valid = torch.cat([state[2], state[2].new_ones(B, T)], dim=1)
        S = k.shape[2]
        # Query i sits at cache position cached + i; key j at j. Allowed: 0 <= (cached + i) - j < window.
        dist = torch.arange(T, device=x.device)[:, None] + cached - torch.arange(S, device=x.device)[None, :]
        mask = ((dist >= 0) & (dist < self.window))[None, None]
        if reset is not None:
            if state is not None:
                raise ShapeError("reset (packed documents) cannot be combined with a KV cache; decode each document "
                                 "separately")
            mask = mask & document_mask(reset)
            doc = torch.cumsum(reset.to(torch.int32), dim=1)
            last = doc == doc[:, -1:]
            key_valid = None if bool(last.all()) else last
        elif key_valid is not None:
            mask = mask & key_valid[:, None, None, :]
        o = sdpa(q, k, v, self.n_heads // self.n_kv_heads, attn_mask=mask)
        y = self._output(o, gate)
        if not return_state:
            return y, None
        keep = min(S, self.window - 1)
        k, v = k[:, :, S - keep:], v[:, :, S - keep:]
        if key_valid is None:
            return y, (k, v)
        return y, (k, v, key_valid[:, S - keep:])

    def mixing_flops_per_token(self, seq_len: int) -> float:
        # Q K^T and A V over the keys each token sees (window_flops_factor of them on average).
        return 4.0 * window_flops_factor(seq_len, self.window) * self.n_heads * self.head_dim

    def state_spec(self, batch: int, context: int, dtype: torch.dtype):
        """The cache (k, v), [B, Hkv, S, Dh] each, with S = context, or min(context, window - 1) in a window."""
        length = context if self.window is None else min(context, self.window - 1)
        kv = meta(batch, self.n_kv_heads, length, self.head_dim, dtype=dtype)
        return (kv, kv)
