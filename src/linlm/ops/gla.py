"""Gated linear attention: the one recurrence behind TNL, HGRN2, cosFormer2 and the SSD-style experts.

One algorithm in its three forms (with the dispatcher that picks one), so the file is longer than most: the forms
share the argument checks and the conventions below, and the chunk form's pieces belong together.

Per head, with state S in R^{K x V}:

    S_t = Diag(a_t) S_{t-1} + k_t v_t^T        o_t = S_t^T q_t

Three forms, which agree to float32 rounding:

- ``gla_reference``: the definition, a loop over time. Used by tests.
- ``gla_chunk``: the chunkwise-parallel form for training and prefill.
- ``gla_step``: one decoding step, O(K V) per head whatever the context.

Conventions shared by all three:

- q, k: [B, T, H, K]; v: [B, T, H, V] (step form: the same without T). No scaling is applied to q. q and k may
  instead have G heads, G dividing H, shared by groups (head h reads group h // (H / G)), as Mamba-2's B and C
  are; the chunk form then computes a group's scores once (``linlm.ops.ssd``).
- ``log_a`` is the log of the gate (<= 0 for a decay; -inf wipes the state): None (a = 1), [H] (a constant per
  head), [B, T, H] (a data-dependent scalar per head) or [B, T, H, K] (a data-dependent vector over key channels).
  The step form takes None, [H], [B, H] or [B, H, K].
- ``reset``: None or bool [B, T] (or [1, T]); True at the first token of a document in a packed row. The carried
  state, including ``initial_state``, is discarded before that token's update; the token's own k v^T is kept.
- Work is done in float32 (float64 if any input is float64). Outputs o have v's dtype; states are returned in the
  working dtype.

How the chunk form works (chunks of C steps; B_t is the sum of log a over [chunk start, t]):

- Per chunk, everything that depends on the gate is one autograd Function (``_ScalarGateChunk`` or
  ``_VectorGateChunk``): the C x C scores A[t, s] = sum_k q_tk k_sk exp(B_tk - B_sk), q_t exp(B_t) (reads the
  incoming state), k_s exp(B_end - B_s) (writes the outgoing state) and exp(B_end). The rest is a few large
  batched matmuls plus ``StateScan``, the only loop, over the T / C chunks.
- Exact and finite for log a_t far below -20 per step: every decay factor is a sum of log-gates (or a product of
  gates) taken from a reference point outwards, so it is <= 1 and accurate wherever it is not negligible. The
  shortcut exp(B_t) / exp(B_s) is never formed.
  - Scalar gates: D[t, s] = exp(sum over (s, t]) from a true segment sum (a masked cumulative sum), C x C.
  - Vector gates: a binary hierarchy of reference points. At each level every block's right half meets its left
    half through one matmul of q * prod(a over (r, t]) and k * prod(a over (s, r]), r the boundary between the
    halves; the diagonal is q_t . k_t. The same safety argument as sub-chunks with pairwise decays over
    [c, c, K], without ever forming a [c, c, K] tensor. benchmarks/bench_ops.py measures the chunk form against the
    reference.
  - exp arguments are clamped at -87: below that float32 exp goes denormal through a very slow path on CPUs, and
    exp(-87) = 1.6e-38 is already nothing next to the terms it is summed with.
- Resets become log a = -inf at the reset position. Sums with -inf stay -inf (nothing is ever subtracted), and
  they map to exact zeros, so a reset wipes the carried state exactly.
- Backward: the two gate Functions have hand-written backward passes. The log-gate gradient is assembled from
  sums over the (s < u <= t) pairs that depend on la_u; no cancelling differences of large terms.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linlm.errors import ShapeError
from linlm.ops import backends
from linlm.ops.chunks import (StateScan, check_chunk_size, check_float, clamped_exp, pow2_at_least,
                              scalar_gate_grad, score_block, segsum, shape_of, to_chunks, work_dtype)
from linlm.ops.ssd import chunk_grouped

__all__ = ["gla", "gla_chunk", "gla_reference", "gla_step", "reset_from_cu_seqlens"]


# --------------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------------


def _gate_kind(log_a, expected: dict, fn: str) -> str:
    """Match log_a against the allowed shapes {kind: shape}; raise ShapeError naming all of them."""
    if log_a is None:
        return "none"
    check_float("log_a", log_a, fn)
    for kind, shape in expected.items():
        if shape_of(log_a) == shape:
            return kind
    allowed = ", ".join(f"{kind} {shape}" for kind, shape in expected.items())
    raise ShapeError(f"{fn}: log_a has shape {shape_of(log_a)}; expected None or one of: {allowed}")


def check_sequence_qkv(q, k, v, fn: str, grouped: bool = False) -> tuple[int, int, int, int, int]:
    """(B, T, H, K, V) of a sequence form's q, k [B, T, H, K] and v [B, T, H, V], after checking their dtypes and
    shapes (a ShapeError naming ``fn`` otherwise). ``grouped``: q and k may have G heads, G dividing v's H."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(name, t, fn)
        if t.dim() != 4:
            raise ShapeError(f"{fn}: {name} must be 4-D [B, T, H, dim], got shape {shape_of(t)}")
    B, T, H, K = q.shape
    if k.shape != q.shape:
        raise ShapeError(f"{fn}: k has shape {shape_of(k)}; expected the shape of q, {shape_of(q)} ([B, T, H, K])")
    if grouped and v.shape[:2] == q.shape[:2] and v.shape[2] % H == 0:
        return B, T, v.shape[2], K, v.shape[3]
    if v.shape[:3] != q.shape[:3]:
        also = f", or a multiple of q's {H} heads" if grouped else ""
        raise ShapeError(
            f"{fn}: v has shape {shape_of(v)}; expected [B, T, H, V] with [B, T, H] = {(B, T, H)} as in q{also}"
        )
    return B, T, H, K, v.shape[3]


def check_state_and_reset(initial_state, reset, dims: tuple[int, int, int, int, int], fn: str) -> None:
    """Check a sequence form's ``initial_state`` [B, H, K, V] and ``reset`` [B, T] (or [1, T]) bool, both
    optional, against ``dims`` = (B, T, H, K, V)."""
    B, T, H, K, V = dims
    if initial_state is not None:
        check_float("initial_state", initial_state, fn)
        if shape_of(initial_state) != (B, H, K, V):
            raise ShapeError(
                f"{fn}: initial_state has shape {shape_of(initial_state)}; expected [B, H, K, V] = {(B, H, K, V)}"
            )
    if reset is not None:
        if not isinstance(reset, Tensor) or reset.dtype != torch.bool:
            got = reset.dtype if isinstance(reset, Tensor) else type(reset).__name__
            raise ShapeError(f"{fn}: reset must be a bool tensor [B, T], got {got}")
        if reset.dim() != 2 or reset.shape[1] != T or reset.shape[0] not in (1, B):
            raise ShapeError(f"{fn}: reset has shape {shape_of(reset)}; expected [B, T] = {(B, T)} or [1, T]")


def _check_sequence(q, k, v, log_a, initial_state, reset, fn: str):
    """Validate the sequence-form arguments; return (B, T, H, K, V, gate kind)."""
    B, T, H, K, V = dims = check_sequence_qkv(q, k, v, fn, grouped=True)
    kind = _gate_kind(log_a, {"head": (H,), "scalar": (B, T, H), "vector": (B, T, H, K)}, fn)
    check_state_and_reset(initial_state, reset, dims, fn)
    return B, T, H, K, V, kind


# --------------------------------------------------------------------------------------------------------------
# Step form and reference
# --------------------------------------------------------------------------------------------------------------


def _step(q: Tensor, k: Tensor, v: Tensor, log_a, S: Tensor, kind: str):
    """One update in the working dtype of S. q, k: [B, H, K]; v: [B, H, V]; S: [B, H, K, V]."""
    dt = S.dtype
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    kv = k.unsqueeze(-1) * v.unsqueeze(-2)
    if kind == "none":
        S = S + kv
    else:
        a = log_a.to(dt).exp()
        if kind == "head":  # [H]
            a = a.view(1, -1, 1, 1)
        elif kind == "scalar":  # [B, H]
            a = a.unsqueeze(-1).unsqueeze(-1)
        else:  # [B, H, K]
            a = a.unsqueeze(-1)
        S = a * S + kv
    o = torch.matmul(q.unsqueeze(-2), S).squeeze(-2)
    return o, S


def check_step_qkv(q, k, v, fn: str, grouped: bool = False) -> tuple[int, int, int, int]:
    """(B, H, K, V) of one decoding step's q, k [B, H, K] and v [B, H, V], after checking their dtypes and shapes
    (a ShapeError naming ``fn`` otherwise). ``grouped``: q and k may have G heads, G dividing v's H."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(name, t, fn)
        if t.dim() != 3:
            raise ShapeError(f"{fn}: {name} must be 3-D [B, H, dim], got shape {shape_of(t)}")
    B, H, K = q.shape
    if k.shape != q.shape:
        raise ShapeError(f"{fn}: k has shape {shape_of(k)}; expected the shape of q, {shape_of(q)} ([B, H, K])")
    if grouped and v.shape[0] == B and v.shape[1] % H == 0:
        return B, v.shape[1], K, v.shape[2]
    if v.shape[:2] != q.shape[:2]:
        also = f", or a multiple of q's {H} heads" if grouped else ""
        raise ShapeError(f"{fn}: v has shape {shape_of(v)}; expected [B, H, V] with [B, H] = {(B, H)} as in q{also}")
    V = v.shape[2]
    return B, H, K, V


def step_state(state, q: Tensor, dims: tuple[int, int, int, int], dt: torch.dtype, fn: str) -> Tensor:
    """A decoding step's state [B, H, K, V] (``dims``) in the working dtype ``dt``: zeros when ``state`` is None,
    else ``state`` after checking its dtype and shape."""
    if state is None:
        return q.new_zeros(dims, dtype=dt)
    check_float("state", state, fn)
    if shape_of(state) != dims:
        raise ShapeError(f"{fn}: state has shape {shape_of(state)}; expected [B, H, K, V] = {dims}")
    return state.to(dt)


def gla_step(q, k, v, log_a=None, *, state=None) -> tuple[Tensor, Tensor]:
    """One decoding step. q, k: [B, H, K]; v: [B, H, V]; log_a: None, [H], [B, H] or [B, H, K];
    state: [B, H, K, V] or None (zeros). Returns (o [B, H, V] in v's dtype, new state in the working dtype)."""
    fn = "gla_step"
    B, H, K, V = check_step_qkv(q, k, v, fn, grouped=True)
    kind = _gate_kind(log_a, {"head": (H,), "scalar": (B, H), "vector": (B, H, K)}, fn)
    dt = work_dtype(q, k, v, log_a, state)
    S = step_state(state, q, (B, H, K, V), dt, fn)
    q, k = ungroup(q, H, 1), ungroup(k, H, 1)
    o, S = _step(q, k, v, log_a, S, kind)
    return o.to(v.dtype), S


def gla_reference(
    q, k, v, log_a=None, *, initial_state=None, reset=None, output_final_state=True
) -> tuple[Tensor, Tensor | None]:
    """The definition: a loop over time. Returns (o [B, T, H, V], final state [B, H, K, V] or None)."""
    B, T, H, K, V, kind = _check_sequence(q, k, v, log_a, initial_state, reset, "gla_reference")
    dt = work_dtype(q, k, v, log_a, initial_state)
    q, k = ungroup(q, H, 2), ungroup(k, H, 2)
    S = q.new_zeros((B, H, K, V), dtype=dt) if initial_state is None else initial_state.to(dt)
    # unbind, not q[:, t]: one backward node per input instead of T full-size zero-filled gradients
    qs, ks, vs = q.unbind(1), k.unbind(1), v.unbind(1)
    gates = log_a.unbind(1) if kind in ("scalar", "vector") else [log_a] * T
    outs = []
    for t in range(T):
        if reset is not None:
            S = torch.where(reset[:, t].view(-1, 1, 1, 1), 0.0, S)
        o, S = _step(qs[t], ks[t], vs[t], gates[t], S, kind)
        outs.append(o)
    o = torch.stack(outs, dim=1) if outs else v.new_zeros((B, 0, H, V), dtype=dt)
    return o.to(v.dtype), (S if output_final_state else None)


def ungroup(x: Tensor, heads: int, dim: int) -> Tensor:
    """Grouped q or k (G heads along ``dim``) as ``heads`` heads, head h a copy of group h // (heads / G)."""
    groups = x.shape[dim]
    return x if groups == heads else x.repeat_interleave(heads // groups, dim=dim)


def reset_from_cu_seqlens(cu_seqlens, total_len: int) -> Tensor:
    """Bool [1, total_len], True at the first position of each document.

    cu_seqlens: 1-D integers [0, end_1, end_2, ..., total_len] (the FlashAttention convention), non-decreasing.
    Empty documents (repeated offsets) are allowed.
    """
    fn = "reset_from_cu_seqlens"
    cu = torch.as_tensor(cu_seqlens)
    device = cu.device
    if cu.dim() != 1 or cu.numel() < 2 or cu.is_floating_point() or cu.dtype == torch.bool:
        raise ShapeError(
            f"{fn}: cu_seqlens must be a 1-D integer sequence [0, ..., total_len] with at least 2 entries, "
            f"got shape {shape_of(cu)} and dtype {cu.dtype}"
        )
    cu = cu.to(torch.long).cpu()
    if int(cu[0]) != 0 or int(cu[-1]) != int(total_len):
        raise ShapeError(
            f"{fn}: cu_seqlens must start at 0 and end at total_len={total_len}, got {cu[0].item()} ... "
            f"{cu[-1].item()}"
        )
    if bool((cu[1:] < cu[:-1]).any()):
        raise ShapeError(f"{fn}: cu_seqlens must be non-decreasing, got {cu.tolist()}")
    reset = torch.zeros(1, int(total_len), dtype=torch.bool)
    reset[0, cu[:-1][cu[:-1] < cu[1:]]] = True  # first positions of non-empty documents
    reset = reset.to(device)
    return reset


# --------------------------------------------------------------------------------------------------------------
# Chunk form: building blocks
# --------------------------------------------------------------------------------------------------------------


def _halves(x: Tensor, h: int):
    """x [..., C, D] -> (left halves, right halves) of the blocks of 2h steps, each [..., C/2h, h, D] (views)."""
    C = x.shape[-2]
    xv = x.view(*x.shape[:-2], C // (2 * h), 2, h, x.shape[-1])
    return xv[..., 0, :, :], xv[..., 1, :, :]


def _place_block(block: Tensor, h: int) -> Tensor:
    """The [..., C, C] matrix, zero but for ``block`` [..., C/2h, h, h] where score_block(., h) would view it."""
    nb = block.shape[-3]
    place = torch.zeros(2, 2, dtype=block.dtype, device=block.device)
    place[1, 0] = 1.0  # the right-half rows meet the left-half columns
    eye = torch.eye(nb, dtype=block.dtype, device=block.device)
    full = torch.einsum("...iab,ij,pq->...ipajqb", block, eye, place)
    return full.reshape(*block.shape[:-3], 2 * nb * h, 2 * nb * h)


def _levels(gate: Tensor):
    """Walk a binary hierarchy over the chunk; yield (h, into_right, from_left) for h = 1, 2, 4, ..., C/2.

    gate: [..., C, K] gate values a_t = exp(log a_t) (C a power of two). At level h the chunk splits into blocks
    of 2h steps, each a left and a right half with the reference point r between them:
      into_right [..., C/2h, h, K] = prod of a over (r, t] for t in each right half,
      from_left  [..., C/2h, h, K] = prod of a over (s, r] for s in each left half.
    Both are products of gates <= 1 taken from the reference point outwards, so nothing overflows and a zero
    gate (a reset) stays an exact zero. The yielded tensors are views, valid until the next step. After the last
    step, returns (prefix, suffix): prod over [chunk start, t] and over (s, chunk end].
    """
    C = gate.shape[-2]
    prefix = gate.clone()  # product over [block start, t] inside blocks of h steps (h = 1: a_t)
    suffix = torch.ones_like(gate)  # product over (s, block end] inside blocks of h steps (h = 1: empty)
    h = 1
    while h < C:
        p_left, p_right = _halves(prefix, h)
        s_left, _ = _halves(suffix, h)
        yield h, p_right, s_left
        s_left.mul_(p_right[..., h - 1 : h, :])  # left half: times the whole right half
        p_right.mul_(p_left[..., h - 1 : h, :])  # right half: times the whole left half
        h *= 2
    return prefix, suffix


def _walk(gate: Tensor, visit):
    """Run _levels to the end, calling visit(h, into_right, from_left) per level; return (prefix, suffix)."""
    it = _levels(gate)
    while True:
        try:
            visit(*next(it))
        except StopIteration as stop:
            return stop.value


class _VectorGateChunk(torch.autograd.Function):
    """Everything inside a chunk that depends on a vector gate.

    Inputs q, k, la: [..., C, K] (C a power of two), and neg_inf (whether la holds -inf resets). With B_t the sum
    of la over [chunk start, t], returns
      scores  [..., C, C]: A[t, s] = sum_k q_tk k_sk exp(B_tk - B_sk) for s <= t, 0 above the diagonal;
      q_start [..., C, K]: q_t * exp(B_t)            (reads the state entering the chunk);
      k_end   [..., C, K]: k_s * exp(B_end - B_s)    (writes the state leaving the chunk);
      decay   [..., K]:    exp(B_end).
    Scores come from the binary hierarchy of ``_levels``: each block's right half against its left half is one
    matmul of q and k rescaled from the reference point between them; the diagonal is q_t . k_t. No [C, C, K]
    tensor and no exp beyond the gates themselves. Saves q, k and the gates; backward walks the hierarchy again.
    """

    @staticmethod
    def forward(ctx, q, k, la, neg_inf):
        gate = clamped_exp(la, neg_inf)
        ctx.save_for_backward(q, k, gate)
        scores = torch.diag_embed((q * k).sum(-1))  # zeros off the diagonal (not a copy_ into a view: exportable)

        def visit(h, into_right, from_left):
            q_r = _halves(q, h)[1] * into_right
            k_l = _halves(k, h)[0] * from_left
            if h == 1:  # 1 x 1 blocks: a row-wise dot product beats thousands of tiny matmuls
                block = (q_r * k_l).sum(-1, keepdim=True)
            else:
                block = torch.matmul(q_r, k_l.transpose(-1, -2))
            if exporting:  # no copy_ into a strided view: the ONNX exporter needs a functional graph
                scores_out.append(_place_block(block, h))
            else:
                score_block(scores, h).copy_(block)

        exporting, scores_out = torch.compiler.is_exporting(), []
        prefix, suffix = _walk(gate, visit)
        if exporting:
            scores = scores + sum(scores_out)
        decay = prefix[..., -1, :].clone()
        if not ctx.needs_input_grad[2]:  # a fixed gate: nothing downstream need work out the decay's gradient
            ctx.mark_non_differentiable(decay)
        return scores, q * prefix, k * suffix, decay

    @staticmethod
    def backward(ctx, d_scores, d_q_start, d_k_end, d_decay):
        q, k, gate = ctx.saved_tensors
        dq = torch.zeros_like(q)  # through the off-diagonal scores
        dk = torch.zeros_like(k)

        def visit(h, into_right, from_left):
            g = score_block(d_scores, h).contiguous()  # [..., C/2h, h(t), h(s)]
            q_r = _halves(q, h)[1] * into_right
            k_l = _halves(k, h)[0] * from_left
            if h == 1:
                _halves(dq, h)[1].addcmul_(g * k_l, into_right)
                _halves(dk, h)[0].addcmul_(g * q_r, from_left)
            else:
                _halves(dq, h)[1].addcmul_(torch.matmul(g, k_l), into_right)
                _halves(dk, h)[0].addcmul_(torch.matmul(g.transpose(-1, -2), q_r), from_left)

        prefix, suffix = _walk(gate, visit)
        dq_start = d_q_start * prefix
        dk_end = d_k_end * suffix
        d_la = None
        if ctx.needs_input_grad[2]:
            d_la = _vector_gate_grad(q, k, dq, dk, dq_start, dk_end, d_decay * prefix[..., -1, :])
        d_diag = d_scores.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)
        dq.addcmul_(d_diag, k).add_(dq_start)
        dk.addcmul_(d_diag, q).add_(dk_end)
        return dq, dk, d_la, None


def _vector_gate_grad(q, k, dq, dk, dq_start, dk_end, d_decay):
    """d la for _VectorGateChunk; dq, dk are the gradients through the off-diagonal scores only.

    d la_u collects: the off-diagonal scores, pairs s < u <= t, as sum_{t >= u} q_t dq_t - sum_{s >= u} k_s dk_s
        (the pairs with u <= s cancel; the diagonal, whose pairs would cancel exactly, is left out of both);
        q_start = q * exp(B_t), every u <= t; k_end = k * exp(B_end - B_s), every u > s; decay, every u.
    dq_start, dk_end: gradients w.r.t. q and k through q_start and k_end; d_decay: d decay * decay.
    """
    d_b = torch.addcmul(q * dq, k, dk, value=-1).addcmul_(q, dq_start)
    d_la = d_b.flip(-2).cumsum(-2).flip(-2)  # sum over t >= u
    g_k = (k * dk_end).cumsum(-2)  # sum over s <= u - 1, shifted into place below
    d_la[..., 1:, :] += g_k[..., :-1, :]
    return d_la.add_(d_decay.unsqueeze(-2))


class _ScalarGateChunk(torch.autograd.Function):
    """Everything inside a chunk that depends on a scalar gate (one per head and step).

    Inputs q, k: [N, B, H, C, K]; la: [N, Bg, H, C] (Bg in (1, B)); neg_inf (whether la holds -inf resets). With
    B_t the sum of la over [chunk start, t], returns the same four tensors as ``_VectorGateChunk``: scores
    (q k^T) * D with D[t, s] = exp(sum of la over (s, t]) built from a true segment sum, q_start = q_t exp(B_t),
    k_end = k_s exp(B_end - B_s) and decay = exp(B_end) [N, Bg, H]. Saves q, k, q k^T, D and exp(B).
    """

    @staticmethod
    def forward(ctx, q, k, la, neg_inf):
        d = clamped_exp(segsum(la), True)  # [N, Bg, H, C(t), C(s)], exactly 0 above the diagonal and across resets
        e_b = clamped_exp(la.cumsum(-1), neg_inf)  # exp(B_t)
        qk = torch.matmul(q, k.transpose(-1, -2))
        ctx.save_for_backward(q, k, qk, d, e_b)
        q_start = q * e_b.unsqueeze(-1)
        k_end = k * d[..., -1, :].unsqueeze(-1)  # row t = C - 1 of D is exp(B_end - B_s)
        decay = e_b[..., -1].clone()
        if not ctx.needs_input_grad[2]:  # a fixed gate (RetNet's, TNL's): the state pass skips the decay's gradient
            ctx.mark_non_differentiable(decay)
        return qk * d, q_start, k_end, decay

    @staticmethod
    def backward(ctx, d_scores, d_q_start, d_k_end, d_decay):
        q, k, qk, d, e_b = ctx.saved_tensors
        f_end = d[..., -1, :]  # exp(B_end - B_s)
        d_s = d_scores * d
        dq = torch.matmul(d_s, k).addcmul_(d_q_start, e_b.unsqueeze(-1))
        dk_end = d_k_end * f_end.unsqueeze(-1)
        dk = torch.matmul(d_s.transpose(-1, -2), q).add_(dk_end)
        if not ctx.needs_input_grad[2]:
            return dq, dk, None, None
        # the scores, q_start = q exp(B_t) and k_end = k exp(B_end - B_s), then the decay exp(B_end): every u
        d_la = scalar_gate_grad(d_s.mul_(qk), (q * d_q_start).sum(-1) * e_b, (k * dk_end).sum(-1), e_b.shape[1])
        d_la += (d_decay * e_b[..., -1]).unsqueeze(-1)
        return dq, dk, d_la, None


# --------------------------------------------------------------------------------------------------------------
# Chunk form
# --------------------------------------------------------------------------------------------------------------


def _gate_chunks(log_a, kind, reset, B, T, H, dt, n_chunks, chunk, device):
    """The log-gate in chunk-major layout: None (no decay, no reset), [N, Bg, H, C] or [N, B, H, C, K].

    Reset positions hold -inf; padding past T holds 0 (it neither decays nor adds to the final state).
    """
    if kind == "none" and reset is None:
        return None
    if kind == "vector":
        la = log_a
        if reset is not None:
            la = torch.where(reset.view(reset.shape[0], T, 1, 1), float("-inf"), la.to(dt))
        return to_chunks(la, dt, n_chunks, chunk)
    if kind == "none":
        la = torch.zeros((1, T, H), dtype=dt, device=device)
    elif kind == "head":
        la = log_a.to(dt).view(1, 1, H).expand(1, T, H)
    else:  # scalar [B, T, H]
        la = log_a
    if reset is not None:
        la = torch.where(reset.view(reset.shape[0], T, 1), float("-inf"), la.to(dt))
    return to_chunks(la, dt, n_chunks, chunk)


def _initial(initial_state, B, H, K, V, dt, like):
    if initial_state is None:
        return like.new_zeros((B, H, K, V), dtype=dt)
    return initial_state.to(dt)


def gla_chunk(
    q, k, v, log_a=None, *, initial_state=None, reset=None, output_final_state=True, chunk_size=64
) -> tuple[Tensor, Tensor | None]:
    """Chunkwise-parallel form: masked matmuls inside chunks of ``chunk_size`` steps, a loop over chunks only.

    Same arguments and results as ``gla_reference``. Cost O(T C K + T K V) per head; T need not be a multiple of
    chunk_size. The chunk used is min(chunk_size, T); with a vector gate it is rounded down to a power of two
    (at least T's next power of two when T is shorter), for the binary hierarchy of ``_VectorGateChunk``.
    """
    fn = "gla_chunk"
    B, T, H, K, V, kind = _check_sequence(q, k, v, log_a, initial_state, reset, fn)
    check_chunk_size(chunk_size, fn)
    dt = work_dtype(q, k, v, log_a, initial_state)
    s0 = _initial(initial_state, B, H, K, V, dt, q)
    if T == 0:
        return v.new_zeros((B, 0, H, V)), (s0 if output_final_state else None)

    C = min(chunk_size, T)
    if kind == "vector":
        C = min(1 << (chunk_size.bit_length() - 1), pow2_at_least(T))
    N = math.ceil(T / C)
    la = _gate_chunks(log_a, kind, reset, B, T, H, dt, N, C, q.device)
    neg_inf = reset is not None
    if q.shape[2] < H and la is not None and la.dim() == 4:  # grouped q and k, a scalar gate: Mamba-2's SSD
        o, final = _grouped(q, k, v, la, s0, neg_inf, dt, N, C)
    elif la is None:
        qc, kc, vc = _per_head_chunks(q, k, v, H, dt, N, C)
        o, final = _chunk_nogate(qc, kc, vc, s0)
    elif la.dim() == 4:
        o, final = _chunk_scalar(*_per_head_chunks(q, k, v, H, dt, N, C), la, s0, neg_inf)
    else:
        o, final = _chunk_vector(*_per_head_chunks(q, k, v, H, dt, N, C), la, s0, neg_inf)

    # [N, B, H, C, V] (or [N, B, G, C, R, V]: the same order of heads) -> [B, N, C, H, V] -> [B, T, H, V]
    o = o.permute(1, 0, 3, 2, *range(4, o.dim())).reshape(B, N * C, H, V)[:, :T]
    o = o.to(dtype=v.dtype, memory_format=torch.contiguous_format)
    return o, (final if output_final_state else None)


def _per_head_chunks(q, k, v, H, dt, N, C):
    """q, k (copied out per head where they are grouped) and v in the chunk-major layout [N, B, H, C, D]."""
    return tuple(to_chunks(x, dt, N, C) for x in (ungroup(q, H, 2), ungroup(k, H, 2), v))


def _grouped(q, k, v, la, s0, neg_inf, dt, N, C):
    """gla_chunk for q, k with G < H heads and la [N, Bg, H, C], by ``linlm.ops.ssd``: (o [N, B, G, C, R, V], the
    final state [B, H, K, V])."""
    B, T, H, V = v.shape
    G, K = q.shape[2], q.shape[3]
    R = H // G
    qc, kc = to_chunks(q, dt, N, C), to_chunks(k, dt, N, C)  # [N, B, G, C, K]
    vc = to_chunks(v.reshape(B, T, G, R * V), dt, N, C)  # [N, B, G, C, R V]: a group's heads side by side
    s0 = s0.view(B, G, R, K, V).transpose(2, 3).contiguous()  # [B, G, K, R, V]
    o, final = chunk_grouped(qc, kc, vc.view(N, B, G, C, R, V), la.view(N, la.shape[1], G, R, C), s0, neg_inf)
    return o, final.transpose(2, 3).reshape(B, H, K, V)


def _chunk_nogate(qc, kc, vc, s0):
    """a = 1 everywhere: causal masking inside chunks, states are a running sum."""
    C = qc.shape[-2]
    causal = torch.ones(C, C, dtype=torch.bool, device=qc.device).tril()
    scores = torch.matmul(qc, kc.transpose(-1, -2)).masked_fill_(~causal, 0.0)
    local = torch.matmul(kc.transpose(-1, -2), vc)  # [N, B, H, K, V]
    prev, final = StateScan.apply(local, None, s0)
    o = torch.matmul(scores, vc) + torch.matmul(qc, prev)
    return o, final


def _chunk_scalar(qc, kc, vc, la, s0, neg_inf):
    """One log-gate per head and step. la: [N, Bg, H, C] with Bg in (1, B)."""
    scores, q_start, k_end, decay = _ScalarGateChunk.apply(qc, kc, la, neg_inf)
    local = torch.matmul(k_end.transpose(-1, -2), vc)
    prev, final = StateScan.apply(local, decay[..., None, None], s0)
    o = torch.matmul(scores, vc) + torch.matmul(q_start, prev)
    return o, final


def _chunk_vector(qc, kc, vc, la, s0, neg_inf):
    """One log-gate per key channel. la: [N, B, H, C, K], C a power of two."""
    scores, q_start, k_end, decay = _VectorGateChunk.apply(qc, kc, la, neg_inf)
    local = torch.matmul(k_end.transpose(-1, -2), vc)
    prev, final = StateScan.apply(local, decay.unsqueeze(-1), s0)
    o = torch.matmul(scores, vc) + torch.matmul(q_start, prev)
    return o, final


def gla(
    q, k, v, log_a=None, *, initial_state=None, reset=None, output_final_state=True, chunk_size=64
) -> tuple[Tensor, Tensor | None]:
    """The op models call. On CUDA, flash-linear-attention's kernels when it is installed (``linlm.ops.backends``
    says which cases, and LINLM_GPU_KERNELS=torch turns them off); else, and always on the CPU, the chunkwise
    form (``gla_chunk``). Same arguments and results as ``gla_chunk`` (chunk_size only matters to it)."""
    if backends.on_gpu(q):
        _, _, H, _, _, kind = _check_sequence(q, k, v, log_a, initial_state, reset, "gla")
        check_chunk_size(chunk_size, "gla")
        q, k = ungroup(q, H, 2), ungroup(k, H, 2)
        out = backends.gla(q, k, v, log_a, kind, initial_state=initial_state, reset=reset,
                           output_final_state=output_final_state)
        if out is not None:
            return out
    return gla_chunk(q, k, v, log_a, initial_state=initial_state, reset=reset,
                     output_final_state=output_final_state, chunk_size=chunk_size)
