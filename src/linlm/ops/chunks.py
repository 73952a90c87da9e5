"""The pieces the chunkwise ops share (ops/gla.py, ops/ssd.py, ops/delta_chunk.py, ops/delta_rule.py): argument
checks, the working dtype, buffers, the clamped exp and segment sums of log-gates, the chunk-major layout, and the
pass over chunks that carries the state."""

from __future__ import annotations

import torch
from torch import Tensor

from linlm.errors import ConfigError, ShapeError


def empty_buffer(like: Tensor, shape) -> Tensor:
    """An uninitialised buffer that the caller overwrites completely. Tests run with
    torch.use_deterministic_algorithms(True), which fills such memory with NaN, so a missed write shows up."""
    return like.new_empty(shape)


def shape_of(t) -> tuple:
    return tuple(t.shape)


def check_float(name: str, t: Tensor, fn: str) -> None:
    if not isinstance(t, Tensor):
        raise ShapeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ShapeError(f"{fn}: {name} must be a floating-point tensor, got dtype {t.dtype}")


def work_dtype(*tensors) -> torch.dtype:
    """float64 if any input is float64, else float32 (bf16 and fp16 inputs are computed in float32)."""
    for t in tensors:
        if t is not None and t.dtype == torch.float64:
            return torch.float64
    return torch.float32


# Below this, float32 exp returns denormals or zero through a slow path on x86 CPUs. A decay
# factor of exp(-87) = 1.6e-38 is already nothing next to any term of the sum, so exponents are clamped here.
EXP_FLOOR = -87.0


def clamped_exp(x: Tensor, neg_inf: bool) -> Tensor:
    """exp(x) for log-decays x <= 0, with x clamped at EXP_FLOOR. If neg_inf, -inf entries (resets) give exactly 0."""
    y = x.clamp_min(EXP_FLOOR).exp()
    return torch.where(x == float("-inf"), 0.0, y) if neg_inf else y


def segsum(x: Tensor) -> Tensor:
    """x [..., n] -> [..., n, n] with out[..., t, s] = sum_{s < u <= t} x_u for s <= t, and -inf for s > t.

    A true segment sum (a masked cumulative sum), never a difference of two prefix sums: exact where it matters,
    and -inf entries in x (resets) give -inf, never NaN. Built as [s, t] so the cumulative sum runs along the last
    (contiguous) dimension, then returned as a transposed view.
    """
    n = x.shape[-1]
    upper = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)  # [s, u]: u > s
    xe = torch.where(upper, x.unsqueeze(-2), torch.zeros((), dtype=x.dtype, device=x.device))  # [s, u] = x_u
    seg = xe.cumsum(-1).masked_fill_(upper.transpose(0, 1), float("-inf"))  # [s, t]; -inf where t < s
    return seg.transpose(-1, -2)


def score_block(a: Tensor, h: int) -> Tensor:
    """View of the (right half rows, left half cols) blocks of a [..., C, C] at level h, as [..., C/2h, h, h]."""
    C = a.shape[-1]
    nb = C // (2 * h)
    av = a.view(*a.shape[:-2], nb, 2, h, nb, 2, h)[..., :, 1, :, :, 0, :]  # [..., nb, h, nb, h]
    return av.diagonal(dim1=-4, dim2=-2).movedim(-1, -3)


def to_chunks(x: Tensor, dt: torch.dtype, n_chunks: int, chunk: int) -> Tensor:
    """[B, T, ...] -> chunk-major [N, B, ..., C] or [N, B, H, C, D] in dtype dt, zero-padded at the end (one copy).

    x is [B, T, H] (a scalar gate) or [B, T, H, D].
    """
    B, T = x.shape[:2]
    pad = n_chunks * chunk - T
    if pad:
        x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
    xv = x.view(B, n_chunks, chunk, *x.shape[2:])
    if x.dim() == 3:  # [B, N, C, H] -> [N, B, H, C]
        xv = xv.permute(1, 0, 3, 2)
    else:  # [B, N, C, H, D] -> [N, B, H, C, D]
        xv = xv.permute(1, 0, 3, 2, 4)
    return xv.to(dtype=dt, memory_format=torch.contiguous_format)


def check_chunk_size(chunk_size, fn: str) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(f"{fn}: chunk_size must be a positive int, got {chunk_size!r}")


def pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def scalar_gate_grad(pairs: Tensor, g_start: Tensor, g_end: Tensor, batch: int) -> Tensor:
    """d la [N, ``batch``, ..., C] of a chunk's scalar log-gates, from the three ways they enter it; each term is a
    sum of non-negative decays times gradients (no cancellation), summed over the batch where it has more rows
    than la (la broadcast over the batch):

    - ``pairs`` [N, B, ..., C(t), C(s)]: dA * (q k^T) * D for each score, which every u with s < u <= t enters
      (taken through cumulative sums over C x C; overwritten);
    - ``g_start`` [..., C]: the gradient reaching exp(B_t), times exp(B_t): every u <= t;
    - ``g_end`` [..., C]: the gradient reaching exp(B_end - B_s), times it: every u > s.
    """
    m = pairs.cumsum(-1)  # [t, v] = sum_{s <= v} pairs[t, s]
    C = m.shape[-1]
    below = torch.ones(C, C, dtype=torch.bool, device=m.device).tril(-1)  # t > v
    cols = m.masked_fill_(~below, 0.0).sum(-2)  # [v] = sum_{t > v, s <= v} pairs[t, s], i.e. u = v + 1

    def shifted(x):  # x[u - 1] at u, 0 at u = 0
        return torch.cat([torch.zeros_like(x[..., :1]), x[..., :-1]], -1)

    def per_la(x):
        return x.sum(1, keepdim=True) if x.shape[1] != batch else x

    return (per_la(shifted(cols)) + per_la(g_start.flip(-1).cumsum(-1).flip(-1))
            + per_la(shifted(g_end.cumsum(-1))))


class StateScan(torch.autograd.Function):
    """The pass over chunks: S_{n+1} = decay_n * S_n + local_n from S_0 = s0 (decay None means 1).

    local: [N, B, ...] (gla's [N, B, H, K, V]), chunk-major so each step touches one contiguous block; decay:
    None or broadcastable to local (gla's [N, Bg, H, 1, 1] or [N, B, H, K, 1]); s0: local's shape without N.
    Returns (prev [N, B, ...], the state entering each chunk; final [B, ...]). One fused op per chunk each way
    instead of a chain of autograd nodes.
    """

    @staticmethod
    def forward(ctx, local, decay, s0):
        N = local.shape[0]
        prev = empty_buffer(local, local.shape)
        final = empty_buffer(local, local.shape[1:])
        prev[0] = s0
        for n in range(N):
            out = prev[n + 1] if n + 1 < N else final
            if decay is None:
                torch.add(local[n], prev[n], out=out)
            else:
                torch.addcmul(local[n], prev[n], decay[n], out=out)
        ctx.save_for_backward(prev, decay)
        return prev, final

    @staticmethod
    def backward(ctx, d_prev, d_final):
        prev, decay = ctx.saved_tensors
        N = prev.shape[0]
        # d_local[n] is the gradient w.r.t. S_{n+1}, all paths included: d_prev[n + 1] + decay[n + 1] d_local[n + 1]
        d_local = empty_buffer(d_prev, prev.shape)
        d_local[N - 1] = d_final
        for n in range(N - 1, -1, -1):
            out = d_local[n - 1] if n > 0 else empty_buffer(d_final, d_final.shape)
            if decay is None:
                torch.add(d_prev[n], d_local[n], out=out)
            else:
                torch.addcmul(d_prev[n], decay[n], d_local[n], out=out)
        d_s0 = out
        d_decay = None
        if decay is not None and ctx.needs_input_grad[1]:
            d_decay = d_local * prev
            dims = [i for i in range(d_decay.dim()) if decay.shape[i] == 1 and d_decay.shape[i] != 1]
            if dims:
                d_decay = d_decay.sum(dim=dims, keepdim=True)
        return d_local, d_decay, d_s0
