"""The chunkwise-parallel form of the delta rule (``linlm.ops.delta_rule``): the WY (UT) representation inside
chunks of C steps, and one pair of matmuls per chunk between them.

Within a chunk whose incoming state is S_0, let B_t be the sum of log a over [chunk start, t] and
D[t, s] = exp(B_t - B_s) for s <= t (a true segment sum, never a ratio of exponentials: ``chunks.segsum``). With the
new values u_t = b_t (v_t - a_t S_{t-1}^T k_t) the state is a sum of rank-one terms,

    S_{t-1} = exp(B_{t-1}) S_0 + sum_{s<t} D[t-1, s] k_s u_s^T,

and putting it into u_t gives, for the whole chunk at once (rows are steps),

    (I + A) u = diag(b) v - diag(b exp(B)) K S_0,      A[t, s] = b_t D[t, s] k_t . k_s  for s < t (else 0).

I + A is unit lower-triangular; with T = (I + A)^{-1} (the UT transform):

    U = T diag(b) V,   W = T diag(b exp(B)) K,   u = U - W S_0.

U and W depend on the chunk's own inputs only, so they are computed for every chunk at once. Between chunks,
the only sequential part (``_StatePass``), per chunk n:

    u_n = U_n - W_n S_n        S_{n+1} = exp(B_end) S_n + (K * exp(B_end - B))^T u_n

and the outputs, again for all chunks at once: o = (Q * exp(B)) S_n + ((Q K^T) * D) u_n, the lower triangle
including the diagonal. Cost per head and token: O(C (K + V) + K V), the loop runs T / C times.

T is formed by recursive doubling (``unit_lower_inverse``): the inverse of a unit lower-triangular matrix of two
blocks is [[T11, 0], [-T22 A21 T11, T22]], so log2(C) levels of batched matmuls, every chunk at once, never a
row-by-row substitution; the blocks are joined with torch.cat, so the graph is functional and exports. Its backward
is dA = -T^T dT T^T (strictly lower part). With unit keys and b in [0, 2], T is a product of contractions'
factors and stays bounded (a power series in A would not: its terms grow like binomial coefficients).

Resets are log a = -inf at a document's first token: D, exp(B) and exp(B_end) then hold exact zeros across it,
so neither S_0 nor any earlier u_s reaches past it. Padding past T is k = v = 0, b = 0, log a = 0: it writes
nothing and does not decay the final state.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linlm.ops.chunks import clamped_exp, empty_buffer, pow2_at_least, score_block, segsum, to_chunks

__all__ = ["chunk_forward", "chunk_length", "unit_lower_inverse"]


def chunk_length(chunk_size: int, T: int) -> int:
    """The chunk used: chunk_size rounded down to a power of two, and no longer than T's next power of two."""
    return min(1 << (chunk_size.bit_length() - 1), pow2_at_least(T))


def unit_lower_inverse(A: Tensor) -> Tensor:
    """(I + A)^{-1} for A [..., C, C] (C a power of two), reading only A's strictly lower triangle.

    Recursive doubling: ``blocks`` holds the inverses of the diagonal blocks of h steps, [..., C/h, h, h]; each
    level joins pairs of them with the off-diagonal block -T22 A21 T11. Functional (torch.cat, no writes into
    views), so torch.export traces it.
    """
    C = A.shape[-1]
    blocks = torch.ones(*A.shape[:-2], C, 1, 1, dtype=A.dtype, device=A.device)
    A = A.contiguous()
    h = 1
    while h < C:
        t11, t22 = blocks[..., 0::2, :, :], blocks[..., 1::2, :, :]
        a21 = score_block(A, h)  # [..., C/2h, h, h]: rows of each right half, columns of its left half
        t21 = -a21 if h == 1 else -torch.matmul(t22, torch.matmul(a21, t11))
        top = torch.cat([t11, torch.zeros_like(t11)], dim=-1)
        blocks = torch.cat([top, torch.cat([t21, t22], dim=-1)], dim=-2)
        h *= 2
    return blocks.squeeze(-3)


class _UnitLowerInverse(torch.autograd.Function):
    """T = (I + A)^{-1} with A strictly lower-triangular; backward dA = -T^T dT T^T, strictly lower part."""

    @staticmethod
    def forward(ctx, A):
        T = unit_lower_inverse(A)
        ctx.save_for_backward(T)
        return T

    @staticmethod
    def backward(ctx, dT):
        (T,) = ctx.saved_tensors
        Tt = T.transpose(-1, -2)
        return torch.matmul(torch.matmul(Tt, dT), Tt).neg_().tril_(-1)


class _StatePass(torch.autograd.Function):
    """The pass over chunks: u_n = U_n - W_n S_n, S_{n+1} = g_n S_n + Ke_n^T u_n from S_0 = s0.

    U: [N, G, C, V]; W, Ke: [N, G, C, K]; g: None (no decay) or [N, G, 1, 1]; s0: [G, K, V] (G = batch x heads).
    Returns (prev [N, G, K, V], the state entering each chunk; u [N, G, C, V]; final [G, K, V]). Two batched
    matmuls per chunk each way, written into preallocated buffers; the products that need no loop (the gradients
    of W, Ke and g) are batched over all chunks after it.
    """

    @staticmethod
    def forward(ctx, U, W, Ke, g, s0):
        N = U.shape[0]
        prev = empty_buffer(U, (N, *s0.shape))
        u = empty_buffer(U, U.shape)
        final = empty_buffer(U, s0.shape)
        prev[0] = s0
        for n in range(N):
            torch.baddbmm(U[n], W[n], prev[n], alpha=-1.0, out=u[n])
            kept = prev[n] if g is None else prev[n] * g[n]
            torch.baddbmm(kept, Ke[n].transpose(-1, -2), u[n], out=prev[n + 1] if n + 1 < N else final)
        ctx.save_for_backward(W, Ke, g, prev, u)
        return prev, u, final

    @staticmethod
    def backward(ctx, d_prev, d_u, d_final):
        W, Ke, g, prev, u = ctx.saved_tensors
        N = prev.shape[0]
        d_next = empty_buffer(prev, prev.shape)  # d_next[n]: the whole gradient w.r.t. S_{n+1}
        du = empty_buffer(u, u.shape)  # the whole gradient w.r.t. u_n
        d_next[N - 1] = d_final
        d_s0 = empty_buffer(d_final, d_final.shape)
        for n in range(N - 1, -1, -1):
            torch.baddbmm(d_u[n], Ke[n], d_next[n], out=du[n])
            kept = d_prev[n] + d_next[n] if g is None else torch.addcmul(d_prev[n], d_next[n], g[n])
            torch.baddbmm(kept, W[n].transpose(-1, -2), du[n], alpha=-1.0, out=d_next[n - 1] if n > 0 else d_s0)
        dW = torch.matmul(du, prev.transpose(-1, -2)).neg_() if ctx.needs_input_grad[1] else None
        dKe = torch.matmul(u, d_next.transpose(-1, -2)) if ctx.needs_input_grad[2] else None
        dg = (prev * d_next).sum((-1, -2), keepdim=True) if g is not None and ctx.needs_input_grad[3] else None
        return du, dW, dKe, dg, d_s0


def _log_gate_chunks(log_a, reset, T: int, H: int, dt, n_chunks: int, chunk: int, device):
    """log a in chunk-major layout [N, Bg, H, C], -inf at resets and 0 on the padding; None for no gate, no reset."""
    if log_a is None and reset is None:
        return None
    la = torch.zeros((1, T, H), dtype=dt, device=device) if log_a is None else log_a.to(dt)
    if reset is not None:
        la = torch.where(reset.view(reset.shape[0], T, 1), float("-inf"), la)
    return to_chunks(la, dt, n_chunks, chunk)


def chunk_forward(q: Tensor, k: Tensor, v: Tensor, beta, log_a, s0: Tensor, reset, chunk_size: int):
    """The chunk form on checked, prepared inputs in the working dtype (q scaled and k normalised already).

    q, k: [B, T, H, K]; v: [B, T, H, V]; beta, log_a: None or [B, T, H]; s0: [B, H, K, V]; T >= 1.
    Returns (o [B, T, H, V] in the working dtype, final state [B, H, K, V]).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    dt = s0.dtype
    C = chunk_length(chunk_size, T)
    N = math.ceil(T / C)
    G = B * H
    qc, kc, vc = (to_chunks(x, dt, N, C) for x in (q, k, v))  # [N, B, H, C, D]
    bc = None if beta is None else to_chunks(beta, dt, N, C)  # [N, B, H, C]
    la = _log_gate_chunks(log_a, reset, T, H, dt, N, C, q.device)  # [N, Bg, H, C]

    kt = kc.transpose(-1, -2)
    kk, qk = torch.matmul(kc, kt), torch.matmul(qc, kt)  # [N, B, H, C, C]
    if la is None:
        scores, A = qk.tril(), kk.tril(-1)
        q_start, k_end, g = qc, kc, None
        w_scale = bc
    else:
        D = clamped_exp(segsum(la), True)  # D[t, s] = exp(B_t - B_s) for s <= t, exactly 0 above and across resets
        e = clamped_exp(la.cumsum(-1), reset is not None)  # exp(B_t)
        scores, A = qk * D, (kk * D).tril(-1)
        q_start, k_end = qc * e.unsqueeze(-1), kc * D[..., -1, :].unsqueeze(-1)
        g = e[..., -1].expand(N, B, H).reshape(N, G, 1, 1)
        w_scale = e if bc is None else bc * e
    if bc is not None:
        A = A * bc.unsqueeze(-1)
    Tinv = _UnitLowerInverse.apply(A)
    vb = vc if bc is None else vc * bc.unsqueeze(-1)
    kb = kc if w_scale is None else kc * w_scale.unsqueeze(-1)
    U, W = torch.matmul(Tinv, vb), torch.matmul(Tinv, kb)

    k_end = k_end.expand(N, B, H, C, K)
    prev, u, final = _StatePass.apply(U.reshape(N, G, C, V), W.reshape(N, G, C, K), k_end.reshape(N, G, C, K), g,
                                      s0.reshape(G, K, V))
    o = torch.matmul(q_start, prev.view(N, B, H, K, V)) + torch.matmul(scores, u.view(N, B, H, C, V))
    o = o.permute(1, 0, 3, 2, 4).reshape(B, N * C, H, V)[:, :T]
    return o, final.view(B, H, K, V)
