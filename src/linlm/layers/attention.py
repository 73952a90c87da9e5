"""LLaMA's token mixer: softmax attention with RoPE through SDPA, decoding with a KV cache.

Its settings beside the shared ones are ``cfg.options``' LLaMA fields (models/archs/llama.py, ``LlamaOptions``:
rope_theta, n_kv_heads, the RoPE scaling): an architecture with attention layers derives its options from those.

Grouped-query attention (``options.n_kv_heads`` < ``cfg.n_heads``): the KV projection and the cache have n_kv_heads
heads, and query head h reads key/value head h // (n_heads / n_kv_heads), transformers' grouping. The fused
projection's rows are [W_q (n_heads * Dh); W_k (n_kv_heads * Dh); W_v (n_kv_heads * Dh)].

The later variants, each off by default (Qwen3-Next's attention layers use all four): ``options.head_dim`` sets Dh
apart from d_model / n_heads (the output projection then maps n_heads * Dh back to d_model); ``qk_norm`` applies an
RMSNorm with a weight (``q_norm``, ``k_norm``) over each head of q and k before RoPE; ``output_gate`` multiplies
each head's output by sigmoid(x W_gate), W_gate's rows sitting after W_q's in the fused projection; and
``rope_fraction`` < 1 turns only the first Dh * rope_fraction channels of each head (their frequencies
theta^(-2i / that width)), leaving the rest as they are.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from linlm.errors import ShapeError
from linlm.layers.mixer import TokenMixer, meta
from linlm.layers.norm import RMSNorm
from linlm.ops.fused import rope_angles, rope_qkv, rope_reference


def document_mask(reset: torch.Tensor) -> torch.Tensor:
    """Boolean [B, 1, T, T] mask: causal and within the same document (documents start where reset is True)."""
    doc = torch.cumsum(reset.to(torch.int32), dim=1)
    same = doc[:, :, None] == doc[:, None, :]
    T = reset.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=reset.device).tril()
    return (same & causal)[:, None]


ROPE_SCALINGS = ("none", "llama3")


def rotary_dims(head_dim: int, fraction: float) -> int:
    """The channels of a head that RoPE turns: the first ``fraction`` of ``head_dim``."""
    return int(round(head_dim * fraction))


def rope_inv_freq(cfg, D: int) -> torch.Tensor | None:
    """RoPE's inverse frequencies [head_dim / 2] when cfg rescales them (Llama 3.1's "llama3" scaling); None for plain
    RoPE (then ops.fused.rope_angles computes theta^(-2i/D) itself).

    llama3: wavelengths shorter than L / high_freq_factor keep their frequency, those longer than L / low_freq_factor
    are slowed by ``rope_factor``, and those between are blended linearly in L / wavelength (L: the original context).
    """
    o = cfg.options
    if o.rope_scaling == "none":
        return None
    inv = 1.0 / (o.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float32, device="cpu") / D))
    L, lo, hi, factor = o.rope_original_max_len, o.rope_low_freq_factor, o.rope_high_freq_factor, o.rope_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > L / lo, inv / factor, inv)
    smooth = (L / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= L / hi) & (wavelen <= L / lo)
    return torch.where(medium, blended, scaled)


def sdpa(q, k, v, groups: int, **kw):
    if groups == 1:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    try:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
    except TypeError:  # torch < 2.5
        return F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), **kw)


KV_GROWTH = 1.25  # a cache buffer, when full, is reallocated with room for this many times the tokens it holds
KV_ROUND = 128  # ... rounded up to a multiple of this many positions


def _exporting() -> bool:
    return torch.jit.is_tracing() or torch.compiler.is_compiling()


def append_kv(cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``cache`` [B, Hkv, S, Dh] with ``new`` [B, Hkv, T, Dh] appended along the positions, without copying the cache.

    The result is a view of the first S + T positions of a buffer with spare room. The buffer remembers how many
    positions hold data; ``new`` is written in place only when ``cache`` ends exactly there, so a state is never
    changed by extending it: extending the same state a second time (two continuations of one prefix) finds the
    buffer filled further and copies into a new buffer, as ``torch.cat`` would. When the buffer is full it is
    reallocated with KV_GROWTH times the room, so decoding n tokens copies O(n) positions in all, not O(n^2).
    Under autograd, tracing or compilation this is plain ``torch.cat``.
    """
    if (_exporting() or cache.dtype != new.dtype or cache.device != new.device
            or (torch.is_grad_enabled() and (cache.requires_grad or new.requires_grad))):
        return torch.cat([cache, new], dim=2)
    B, H, S, D = cache.shape
    T = new.shape[2]
    base = cache._base
    # In place only into a buffer made here (it carries _linlm_filled) whose first S positions are exactly `cache`.
    if (base is not None and getattr(base, "_linlm_filled", None) == S and base.dim() == 4
            and base.shape[:2] == (B, H) and base.shape[3] == D and base.shape[2] >= S + T
            and cache.data_ptr() == base.data_ptr() and cache.stride() == base.stride()):
        base[:, :, S:S + T].copy_(new)
        base._linlm_filled = S + T
        return base[:, :, :S + T]
    room = int(math.ceil(KV_GROWTH * (S + T) / KV_ROUND)) * KV_ROUND
    base = torch.empty(B, H, room, D, dtype=new.dtype, device=new.device)
    base[:, :, :S].copy_(cache)
    base[:, :, S:S + T].copy_(new)
    base._linlm_filled = S + T
    return base[:, :, :S + T]


class Attention(TokenMixer):
    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        o = cfg.options
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.kv_heads
        self.head_dim = o.head_dim or cfg.head_dim
        self.rotary = rotary_dims(self.head_dim, o.rope_fraction)
        self.rope_theta = o.rope_theta
        self.gated = o.output_gate
        d, H = cfg.d_model, self.n_heads
        self.q_rows = (2 if self.gated else 1) * H * self.head_dim
        self.qkv = nn.Linear(d, self.q_rows + 2 * self.n_kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(H * self.head_dim, d, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.norm_eps, weight=True) if o.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.norm_eps, weight=True) if o.qk_norm else None
        self.plain = not (self.gated or o.qk_norm or self.rotary < self.head_dim)
        # A plain attribute, not a buffer: model.to(bfloat16) must not round the frequencies.
        self.inv_freq = rope_inv_freq(cfg, self.rotary)
        self._rope_table = None  # (device, dtype, cos, sin) of positions 0 .. n - 1: see _angles

    def _project(self, x, offset):
        """q [B, H, T, Dh], k and v [B, Hkv, T, Dh], with RoPE applied to q and k, and the output gate's
        pre-activation [B, T, H * Dh] (None without one)."""
        B, T, _ = x.shape
        H, Hkv, Dh = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.qkv(x)
        cos, sin = self._angles(offset, T, x.device, qkv.dtype)
        if Hkv == H and self.plain:
            return (*rope_qkv(qkv.view(B, T, 3, H, Dh), cos, sin).unbind(0), None)
        q, k, v = qkv.split([self.q_rows, Hkv * Dh, Hkv * Dh], dim=-1)
        gate = None
        if self.gated:
            q, gate = q.split([H * Dh, H * Dh], dim=-1)
        q, k = q.view(B, T, H, Dh), k.view(B, T, Hkv, Dh)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self._rope(q.transpose(1, 2), cos, sin), self._rope(k.transpose(1, 2), cos, sin)
        return q, k, v.view(B, T, Hkv, Dh).transpose(1, 2), gate

    def _rope(self, x, cos, sin):
        """RoPE on the first ``rotary`` channels of each head of x [B, heads, T, Dh]."""
        if self.rotary == self.head_dim:
            return rope_reference(x, cos, sin)
        return torch.cat([rope_reference(x[..., :self.rotary], cos, sin), x[..., self.rotary:]], dim=-1)

    def _output(self, o, gate):
        """The output projection of o [B, H, T, Dh], each head's output gated first where the layer has a gate."""
        B, _, T, _ = o.shape
        o = o.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.out(o if gate is None else o * torch.sigmoid(gate))

    def _angles(self, offset, T: int, device, dtype):
        """cos and sin of positions offset .. offset + T - 1. Outside tracing, slices of a table of positions from 0
        that grows by doubling: a decode step then costs two views instead of the few small kernels that compute
        the angles (per layer and token, a few percent of a step at batch 1). The table holds the values
        rope_angles computes for each position, bit for bit (the same element-wise float32 operations)."""
        def angles(positions):
            inv_freq = None if self.inv_freq is None else self.inv_freq.to(device)
            return rope_angles(positions, self.rotary, self.rope_theta, dtype, inv_freq=inv_freq)

        if (not isinstance(offset, int) or torch.compiler.is_compiling() or torch.compiler.is_exporting()
                or torch.jit.is_tracing()):
            return angles(torch.arange(T, device=device) + offset)
        end, table = offset + T, self._rope_table
        if table is None or table[0] != device or table[1] != dtype or table[2].shape[0] < end:
            size = max(256, 1 << (end - 1).bit_length(), 0 if table is None else table[2].shape[0])
            table = self._rope_table = (device, dtype, *angles(torch.arange(size, device=device)))
        return table[2][offset:end], table[3][offset:end]

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        """The state is the KV cache (k, v), [B, Hkv, S, Dh] each, or (k, v, key_valid) after a packed prefill:
        key_valid [B, S] is False at the keys of earlier documents, which later tokens must not see (decoding
        continues each row's last document, as the linear models' states do)."""
        B, T, d = x.shape
        groups = self.n_heads // self.n_kv_heads
        q, k, v, gate = self._project(x, offset)
        key_valid = None
        if state is not None:
            k = append_kv(state[0], k)
            v = append_kv(state[1], v)
            if len(state) == 3:
                key_valid = torch.cat([state[2], state[2].new_ones(B, T)], dim=1)
        S = k.shape[2]
        if reset is not None:
            if state is not None:
                raise ShapeError("reset (packed documents) cannot be combined with a KV cache; decode each document separately")
            o = sdpa(q, k, v, groups, attn_mask=document_mask(reset))
            doc = torch.cumsum(reset.to(torch.int32), dim=1)
            last = doc == doc[:, -1:]
            key_valid = None if bool(last.all()) else last
        elif state is None:
            o = sdpa(q, k, v, groups, is_causal=True)
        elif T == 1 and key_valid is None:
            o = sdpa(q, k, v, groups)
        else:
            mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=S - T)
            if key_valid is not None:
                mask = mask & key_valid[:, None, None, :]
            o = sdpa(q, k, v, groups, attn_mask=mask)
        y = self._output(o, gate)
        if not return_state:
            return y, None
        return y, ((k, v) if key_valid is None else (k, v, key_valid))

    def mixing_flops_per_token(self, seq_len: int) -> float:
        # Q K^T and A V over the causal context: position t attends to t keys, (n + 1) / 2 on average.
        # (The paper's formula counts the full n x n square, twice this.)
        return 2.0 * (seq_len + 1) * self.n_heads * self.head_dim

    def state_spec(self, batch: int, context: int, dtype: torch.dtype):
        """The KV cache (k, v), [B, Hkv, context, Dh] each; it grows with the context. (After a packed prefill a
        third tensor, key_valid [B, context] bool, marks the keys of the last document: see forward.)"""
        kv = meta(batch, self.n_kv_heads, context, self.head_dim, dtype=dtype)
        return (kv, kv)
