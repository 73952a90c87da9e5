"""The chunk form of gated linear attention with a scalar gate and q, k shared by groups of heads: Mamba-2's SSD
(arXiv 2405.21060, sections 6-7). ``linlm.ops.gla.gla_chunk`` takes this path when q and k have fewer heads than v
and the gate is one scalar per head (and step, or constant).

With G groups of R = H / G heads (head h reads group h // R), per chunk of C steps:

- the C x C scores q_t . k_s are one matmul per group, not per head; only the decay mask
  D[t, s] = exp(sum of log a over (s, t]) is per head;
- head h reads the state entering the chunk as exp(B_t) (q_t^T S_h): one matmul of the group's q against its R
  heads' states side by side ([K, R V]), then a scale per head and step;
- head h adds k^T (exp(B_end - B_s) v_s) to the state leaving the chunk: one matmul of the group's k against its
  R heads' rescaled values side by side.

So nothing per head ever has the key width K: the per-head factors are applied on the value side. Against gla's
per-head scalar-gate chunks this saves the H - G redundant score matmuls each way and every per-head copy of q
and k (Mamba-2 at paper-70m: G = 1, H = 16, K = 112).

The same safety as gla's scalar-gate chunks: every decay is a sum of log-gates taken outwards from a reference
point (a true segment sum, never a difference of prefix sums), exponents are clamped at ``EXP_FLOOR``, resets are
-inf and give exact zeros, and the log-gate gradient is assembled from sums of non-negative decays times
gradients (no cancellation).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linlm.ops.chunks import StateScan, clamped_exp, scalar_gate_grad, segsum


class _GroupedScalarGate(torch.autograd.Function):
    """Everything inside a chunk that depends on the gate, for grouped q and k.

    Inputs q, k: [N, B, G, C, K]; la: [N, Bg, G, R, C] (Bg in (1, B)); neg_inf (whether la holds -inf resets).
    Returns scores [N, B, G, R, C, C] = (q k^T) * D per head, e_b [N, Bg, G, R, C] = exp(B_t) and
    f_end [N, Bg, G, R, C] = exp(B_end - B_s). Saves q, k, q k^T (per group), D and exp(B).
    """

    @staticmethod
    def forward(ctx, q, k, la, neg_inf):
        d = clamped_exp(segsum(la), True)  # [N, Bg, G, R, C(t), C(s)]: 0 above the diagonal and across resets
        e_b = clamped_exp(la.cumsum(-1), neg_inf)
        qk = torch.matmul(q, k.transpose(-1, -2))  # [N, B, G, C, C]
        ctx.save_for_backward(q, k, qk, d, e_b)
        f_end = d[..., -1, :].clone()  # row t = C - 1 of D is exp(B_end - B_s)
        if not ctx.needs_input_grad[2]:  # a fixed gate: no gradient through the factors that depend on it alone
            ctx.mark_non_differentiable(e_b, f_end)
        return qk.unsqueeze(3) * d, e_b, f_end

    @staticmethod
    def backward(ctx, d_scores, d_e_b, d_f_end):
        q, k, qk, d, e_b = ctx.saved_tensors
        d_s = d_scores * d
        d_group = d_s.sum(3)  # the heads of a group share q and k
        dq = torch.matmul(d_group, k)
        dk = torch.matmul(d_group.transpose(-1, -2), q)
        if not ctx.needs_input_grad[2]:
            return dq, dk, None, None
        # the scores, exp(B_t) and exp(B_end - B_s) (the decay exp(B_end) is e_b's last entry)
        d_la = scalar_gate_grad(d_s.mul_(qk.unsqueeze(3)), d_e_b * e_b, d_f_end * d[..., -1, :], e_b.shape[1])
        return dq, dk, d_la, None


def chunk_grouped(q: Tensor, k: Tensor, v: Tensor, la: Tensor, s0: Tensor, neg_inf: bool) -> tuple[Tensor, Tensor]:
    """The chunk form for grouped q and k and a scalar gate.

    q, k: [N, B, G, C, K]; v: [N, B, G, C, R, V] (the R heads of a group side by side); la: [N, Bg, G, R, C];
    s0: [B, G, K, R, V]. Returns (o [N, B, G, C, R, V], final state [B, G, K, R, V]).
    """
    N, B, G, C, K = q.shape
    R, V = v.shape[-2:]
    scores, e_b, f_end = _GroupedScalarGate.apply(q, k, la, neg_inf)
    intra = torch.matmul(scores, v.transpose(3, 4))  # [N, B, G, R, C, V]
    # the state leaving each chunk: k^T (exp(B_end - B_s) v_s), all R heads in one matmul
    scaled = v * f_end.transpose(3, 4).unsqueeze(-1)
    local = torch.matmul(k.transpose(-1, -2), scaled.reshape(N, B, G, C, R * V))  # [N, B, G, K, R V]
    decay = e_b[..., -1][:, :, :, None, :, None]  # [N, Bg, G, 1, R, 1]: exp(B_end) per head
    prev, final = StateScan.apply(local.view(N, B, G, K, R, V), decay, s0)
    # reading the state entering each chunk: exp(B_t) (q_t^T S), all R heads in one matmul
    inter = torch.matmul(q, prev.view(N, B, G, K, R * V)).view(N, B, G, C, R, V)
    o = torch.addcmul(intra.transpose(3, 4), inter, e_b.transpose(3, 4).unsqueeze(-1))
    return o, final
