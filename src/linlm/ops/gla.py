"""Gated linear attention: the one recurrence behind TNL, HGRN2, cosFormer2 and the SSD-style experts.

Per head, with state S in R^{K x V}:

    S_t = Diag(a_t) S_{t-1} + k_t v_t^T        o_t = S_t^T q_t

Three forms, which agree to float32 rounding:

- ``gla_reference``: the definition, a loop over time. Used by tests.
- ``gla_chunk``: the chunkwise-parallel form for training and prefill (see spec/chunkwise.md).
- ``gla_step``: one decoding step, O(K V) per head whatever the context.

Conventions shared by all three:

- q, k: [B, T, H, K]; v: [B, T, H, V] (step form: the same without T). No scaling is applied to q.
- ``log_a`` is the log of the gate (<= 0 for a decay; -inf wipes the state): None (a = 1), [H] (a constant per
  head), [B, T, H] (a data-dependent scalar per head) or [B, T, H, K] (a data-dependent vector over key channels).
  The step form takes None, [H], [B, H] or [B, H, K].
- ``reset``: None or bool [B, T] (or [1, T]); True at the first token of a document in a packed row. The carried
  state, including ``initial_state``, is discarded before that token's update; the token's own k v^T is kept.
- Work is done in float32 (float64 if any input is float64). Outputs o have v's dtype; states are returned in the
  working dtype.

How the chunk form stays exact and finite with log a_t far below -20 per step:

- Every decay factor is exp of a sum of log-gates taken over an interval that starts at a reference point
  (a chunk or sub-chunk boundary, or the position itself), so each exponent is <= 0 and is accurate where the
  factor is not negligible. The shortcut exp(b_t) / exp(b_s) is never formed.
- Scalar gates: the C x C decay matrix is exp of a true segment sum (a masked cumulative sum over (s, t]).
- Vector gates: sub-chunks of ``SUBCHUNK`` steps. Across sub-chunks the scores are matmuls of
  q_t * exp(sum over (r, t]) and k_s * exp(sum over (s, r]); inside a diagonal sub-chunk the decay is formed
  pairwise, as a cumulative product over (s, t] (``_DiagScores``, with a hand-written backward that recomputes it).
- Resets become log a = -inf; every sum above is a true segment sum, so -inf only ever meets finite numbers or
  another -inf of the same sign, and exp(-inf) = 0 wipes the state exactly.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linlm.errors import ConfigError, ShapeError

__all__ = ["gla", "gla_chunk", "gla_reference", "gla_step", "reset_from_cu_seqlens"]

# Sub-chunk length for vector (per key channel) gates. The pairwise decay inside a diagonal sub-chunk costs
# SUBCHUNK * K elementwise work per token; see benchmarks/bench_ops.py for the measurement behind the value.
SUBCHUNK = 16

# Debug switch for tests: buffers made with torch.empty are filled with NaN, so that memory the op forgets to
# write shows up in its outputs.
POISON_EMPTY = False


def _empty(like: Tensor, shape) -> Tensor:
    out = like.new_empty(shape)
    if POISON_EMPTY:
        out.fill_(float("nan"))
    return out


# --------------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------------


def _shape(t) -> tuple:
    return tuple(t.shape)


def _check_float(name: str, t: Tensor, fn: str) -> None:
    if not isinstance(t, Tensor):
        raise ShapeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ShapeError(f"{fn}: {name} must be a floating-point tensor, got dtype {t.dtype}")


def _gate_kind(log_a, expected: dict, fn: str) -> str:
    """Match log_a against the allowed shapes {kind: shape}; raise ShapeError naming all of them."""
    if log_a is None:
        return "none"
    _check_float("log_a", log_a, fn)
    for kind, shape in expected.items():
        if _shape(log_a) == shape:
            return kind
    allowed = ", ".join(f"{kind} {shape}" for kind, shape in expected.items())
    raise ShapeError(f"{fn}: log_a has shape {_shape(log_a)}; expected None or one of: {allowed}")


def _check_sequence(q, k, v, log_a, initial_state, reset, fn: str):
    """Validate the sequence-form arguments; return (B, T, H, K, V, gate kind)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_float(name, t, fn)
        if t.dim() != 4:
            raise ShapeError(f"{fn}: {name} must be 4-D [B, T, H, dim], got shape {_shape(t)}")
    B, T, H, K = q.shape
    if k.shape != q.shape:
        raise ShapeError(f"{fn}: k has shape {_shape(k)}; expected the shape of q, {_shape(q)} ([B, T, H, K])")
    if v.shape[:3] != q.shape[:3]:
        raise ShapeError(
            f"{fn}: v has shape {_shape(v)}; expected [B, T, H, V] with [B, T, H] = {(B, T, H)} as in q"
        )
    V = v.shape[3]
    kind = _gate_kind(log_a, {"head": (H,), "scalar": (B, T, H), "vector": (B, T, H, K)}, fn)
    if initial_state is not None:
        _check_float("initial_state", initial_state, fn)
        if _shape(initial_state) != (B, H, K, V):
            raise ShapeError(
                f"{fn}: initial_state has shape {_shape(initial_state)}; expected [B, H, K, V] = {(B, H, K, V)}"
            )
    if reset is not None:
        if not isinstance(reset, Tensor) or reset.dtype != torch.bool:
            got = reset.dtype if isinstance(reset, Tensor) else type(reset).__name__
            raise ShapeError(f"{fn}: reset must be a bool tensor [B, T], got {got}")
        if reset.dim() != 2 or reset.shape[1] != T or reset.shape[0] not in (1, B):
            raise ShapeError(f"{fn}: reset has shape {_shape(reset)}; expected [B, T] = {(B, T)} or [1, T]")
    return B, T, H, K, V, kind


def _work_dtype(*tensors) -> torch.dtype:
    """float64 if any input is float64, else float32 (bf16 and fp16 inputs are computed in float32)."""
    for t in tensors:
        if t is not None and t.dtype == torch.float64:
            return torch.float64
    return torch.float32


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


def gla_step(q, k, v, log_a=None, *, state=None) -> tuple[Tensor, Tensor]:
    """One decoding step. q, k: [B, H, K]; v: [B, H, V]; log_a: None, [H], [B, H] or [B, H, K];
    state: [B, H, K, V] or None (zeros). Returns (o [B, H, V] in v's dtype, new state in the working dtype)."""
    fn = "gla_step"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_float(name, t, fn)
        if t.dim() != 3:
            raise ShapeError(f"{fn}: {name} must be 3-D [B, H, dim], got shape {_shape(t)}")
    B, H, K = q.shape
    if k.shape != q.shape:
        raise ShapeError(f"{fn}: k has shape {_shape(k)}; expected the shape of q, {_shape(q)} ([B, H, K])")
    if v.shape[:2] != q.shape[:2]:
        raise ShapeError(f"{fn}: v has shape {_shape(v)}; expected [B, H, V] with [B, H] = {(B, H)} as in q")
    V = v.shape[2]
    kind = _gate_kind(log_a, {"head": (H,), "scalar": (B, H), "vector": (B, H, K)}, fn)
    dt = _work_dtype(q, k, v, log_a, state)
    if state is None:
        S = q.new_zeros((B, H, K, V), dtype=dt)
    else:
        _check_float("state", state, fn)
        if _shape(state) != (B, H, K, V):
            raise ShapeError(f"{fn}: state has shape {_shape(state)}; expected [B, H, K, V] = {(B, H, K, V)}")
        S = state.to(dt)
    o, S = _step(q, k, v, log_a, S, kind)
    return o.to(v.dtype), S


def gla_reference(
    q, k, v, log_a=None, *, initial_state=None, reset=None, output_final_state=True
) -> tuple[Tensor, Tensor | None]:
    """The definition: a loop over time. Returns (o [B, T, H, V], final state [B, H, K, V] or None)."""
    B, T, H, K, V, kind = _check_sequence(q, k, v, log_a, initial_state, reset, "gla_reference")
    dt = _work_dtype(q, k, v, log_a, initial_state)
    S = q.new_zeros((B, H, K, V), dtype=dt) if initial_state is None else initial_state.to(dt)
    outs = []
    for t in range(T):
        if reset is not None:
            S = torch.where(reset[:, t].view(-1, 1, 1, 1), 0.0, S)
        gate = log_a if kind in ("none", "head") else log_a[:, t]
        o, S = _step(q[:, t], k[:, t], v[:, t], gate, S, kind)
        outs.append(o)
    o = torch.stack(outs, dim=1) if outs else v.new_zeros((B, 0, H, V), dtype=dt)
    return o.to(v.dtype), (S if output_final_state else None)


def reset_from_cu_seqlens(cu_seqlens, total_len: int) -> Tensor:
    """Bool [1, total_len], True at the first position of each document.

    cu_seqlens: 1-D integers [0, end_1, end_2, ..., total_len] (the FlashAttention convention), non-decreasing.
    Empty documents (repeated offsets) are allowed.
    """
    fn = "reset_from_cu_seqlens"
    cu = torch.as_tensor(cu_seqlens)
    if cu.dim() != 1 or cu.numel() < 2 or cu.is_floating_point() or cu.dtype == torch.bool:
        raise ShapeError(
            f"{fn}: cu_seqlens must be a 1-D integer sequence [0, ..., total_len] with at least 2 entries, "
            f"got shape {_shape(cu)} and dtype {cu.dtype}"
        )
    cu = cu.to(torch.long).cpu()
    if int(cu[0]) != 0 or int(cu[-1]) != int(total_len):
        raise ShapeError(
            f"{fn}: cu_seqlens must start at 0 and end at total_len={total_len}, got {cu[0].item()} ... "
            f"{cu[-1].item()}"
        )
    if bool((cu[1:] < cu[:-1]).any()):
        raise ShapeError(f"{fn}: cu_seqlens must be non-decreasing, got {cu.tolist()}")
    reset = torch.zeros(1, int(total_len), dtype=torch.bool, device=torch.as_tensor(cu_seqlens).device)
    starts = cu[:-1][cu[:-1] < cu[1:]]  # first positions of non-empty documents
    reset[0, starts.to(reset.device)] = True
    return reset


# --------------------------------------------------------------------------------------------------------------
# Chunk form: building blocks
# --------------------------------------------------------------------------------------------------------------


def _segsum(x: Tensor) -> Tensor:
    """x [..., n] -> [..., n, n] with out[..., t, s] = sum_{s < u <= t} x_u for s <= t, and -inf for s > t.

    A true segment sum (a masked cumulative sum), never a difference of two prefix sums: exact where it matters,
    and -inf entries in x (resets) give -inf, never NaN.
    """
    n = x.shape[-1]
    ones = torch.ones(n, n, dtype=torch.bool, device=x.device)
    xe = x.unsqueeze(-1).expand(*x.shape, n).masked_fill(~torch.tril(ones, -1), 0.0)  # [u, s] = x_u if u > s
    return xe.cumsum(-2).masked_fill(~torch.tril(ones), float("-inf"))


def _prefix_excl(x: Tensor, dim: int) -> Tensor:
    """Exclusive prefix sum along dim: out_i = sum_{j < i} x_j (exact: a shifted cumulative sum)."""
    c = x.cumsum(dim)
    return torch.cat([torch.zeros_like(c.narrow(dim, 0, 1)), c.narrow(dim, 0, c.shape[dim] - 1)], dim)


def _suffix_excl(x: Tensor, dim: int) -> Tensor:
    """Exclusive suffix sum along dim: out_i = sum_{j > i} x_j (a reversed cumulative sum, never total - prefix)."""
    n = x.shape[dim]
    c = x.narrow(dim, 1, n - 1).flip(dim).cumsum(dim).flip(dim)
    return torch.cat([c, torch.zeros_like(x.narrow(dim, 0, 1))], dim)


class _StateScan(torch.autograd.Function):
    """states[n + 1] = decay[n] * states[n] + local[n], states[0] = s0.

    local: [B, H, N, K, V]; decay: broadcastable to it ([Bd, H, N, 1, 1] or [B, H, N, K, 1]); s0: [B, H, K, V].
    Returns states [B, H, N + 1, K, V]. A loop over the N chunks, one fused op per step each way, instead of a
    chain of autograd nodes.
    """

    @staticmethod
    def forward(ctx, local, decay, s0):
        B, H, N, K, V = local.shape
        states = _empty(local, (B, H, N + 1, K, V))
        states[:, :, 0] = s0
        for n in range(N):
            torch.addcmul(local[:, :, n], states[:, :, n], decay[:, :, n], out=states[:, :, n + 1])
        ctx.save_for_backward(states, decay)
        return states

    @staticmethod
    def backward(ctx, g):
        states, decay = ctx.saved_tensors
        N = states.shape[2] - 1
        g = g.contiguous()
        d_local = _empty(g, (g.shape[0], g.shape[1], N, g.shape[3], g.shape[4]))
        u = g[:, :, N]  # gradient of the loss w.r.t. states[N], all paths included
        for n in range(N - 1, -1, -1):
            d_local[:, :, n] = u
            u = torch.addcmul(g[:, :, n], decay[:, :, n], u)
        d_decay = None
        if ctx.needs_input_grad[1]:
            d_decay = d_local * states[:, :, :N]
            dims = [i for i in range(5) if decay.shape[i] == 1 and d_decay.shape[i] != 1]
            if dims:
                d_decay = d_decay.sum(dim=dims, keepdim=True)
        return d_local, d_decay, u


def _pair_decay(la: Tensor) -> Tensor:
    """la [..., c, K] -> P [..., c(s), c(t), K] with P[s, t] = prod_{s < u <= t} exp(la_u) for t >= s.

    Entries with t < s are 1 (finite junk that callers mask out of the c x c result). Built as a cumulative
    product of gates (each <= 1 for log a <= 0), so no exponent ever grows.
    """
    c = la.shape[-2]
    a = la.exp().unsqueeze(-3)  # [..., 1, c(u), K]
    keep = torch.ones(c, c, dtype=torch.bool, device=la.device).triu(1).unsqueeze(-1)  # [s, u]: u > s
    return torch.where(keep, a, torch.ones((), dtype=la.dtype, device=la.device)).cumprod_(-2)


class _DiagScores(torch.autograd.Function):
    """Scores inside diagonal sub-chunks with a vector gate, formed pairwise.

    q, k, la: [..., c, K]. Returns A [..., c(t), c(s)], A[t, s] = sum_k q_tk k_sk prod_{s < u <= t} a_uk for
    s <= t, else 0. The [c, c, K] decay tensor is recomputed in backward rather than stored, and the gradient of
    la uses d(log-gate prefix)_t = q_t * dq_t - k_t * dk_t, so backward never differentiates through it.
    """

    @staticmethod
    def forward(ctx, q, k, la):
        ctx.save_for_backward(q, k, la)
        c = q.shape[-2]
        x = _pair_decay(la).mul_(q.unsqueeze(-3))  # [s, t, k] = P[s, t, k] q[t, k]
        a_t = torch.matmul(x, k.unsqueeze(-1)).squeeze(-1)  # [s, t]
        causal_t = torch.ones(c, c, dtype=torch.bool, device=q.device).triu()  # [s, t]: t >= s
        return a_t.masked_fill_(~causal_t, 0.0).transpose(-1, -2)

    @staticmethod
    def backward(ctx, d_a):
        q, k, la = ctx.saved_tensors
        c = q.shape[-2]
        causal_t = torch.ones(c, c, dtype=torch.bool, device=q.device).triu()
        d_at = d_a.transpose(-1, -2).masked_fill(~causal_t, 0.0)  # [s, t]
        p = _pair_decay(la)
        # dk[s] = sum_t dA[t, s] P[s, t] q[t]: a batched vector-matrix product over s.
        x = p * q.unsqueeze(-3)
        dk = torch.matmul(d_at.unsqueeze(-2), x).squeeze(-2)
        del x
        # dq[t] = sum_s dA[t, s] P[s, t] k[s]
        dq = p.mul_(d_at.unsqueeze(-1)).mul_(k.unsqueeze(-2)).sum(-3)
        d_b = q * dq - k * dk
        d_la = d_b.flip(-2).cumsum(-2).flip(-2)  # sum over t >= u inside the sub-chunk
        return dq, dk, d_la


# --------------------------------------------------------------------------------------------------------------
# Chunk form
# --------------------------------------------------------------------------------------------------------------


def _to_chunks(x: Tensor, dt: torch.dtype, n_chunks: int, chunk: int) -> Tensor:
    """[B, T, H, D] -> [B, H, N, C, D] in dtype dt, zero-padded at the end, contiguous (one copy)."""
    B, T, H, D = x.shape
    xt = x.transpose(1, 2).to(dt)
    pad = n_chunks * chunk - T
    if pad:
        xt = torch.nn.functional.pad(xt, (0, 0, 0, pad))
    return xt.contiguous().view(B, H, n_chunks, chunk, D)


def _gate_chunks(log_a, kind, reset, B, T, H, K, dt, n_chunks, chunk, device):
    """The log-gate in chunk layout: None (no decay, no reset), [Bg, H, N, C] (scalar) or [B, H, N, C, K].

    Reset positions hold -inf; padding past T holds 0 (so it neither decays nor adds to the final state).
    """
    if kind == "none" and reset is None:
        return None
    pad = n_chunks * chunk - T
    if kind == "vector":
        la = log_a.to(dt).transpose(1, 2)  # [B, H, T, K]
        if reset is not None:
            la = torch.where(reset.view(reset.shape[0], 1, T, 1), float("-inf"), la)
        la = torch.nn.functional.pad(la, (0, 0, 0, pad)) if pad else la.contiguous()
        return la.view(B, H, n_chunks, chunk, K)
    if kind == "none":
        la = torch.zeros((1, 1, T), dtype=dt, device=device)
    elif kind == "head":
        la = log_a.to(dt).view(1, H, 1).expand(1, H, T)
    else:  # scalar [B, T, H]
        la = log_a.to(dt).transpose(1, 2)
    if reset is not None:
        la = torch.where(reset.view(reset.shape[0], 1, T), float("-inf"), la)
    la = la.expand(la.shape[0], H, T)
    la = torch.nn.functional.pad(la, (0, pad)) if pad else la.contiguous()
    return la.view(la.shape[0], H, n_chunks, chunk)


def _initial(initial_state, B, H, K, V, dt, like):
    if initial_state is None:
        return like.new_zeros((B, H, K, V), dtype=dt)
    return initial_state.to(dt)


def gla_chunk(
    q, k, v, log_a=None, *, initial_state=None, reset=None, output_final_state=True, chunk_size=64
) -> tuple[Tensor, Tensor | None]:
    """Chunkwise-parallel form: masked matmuls inside chunks of ``chunk_size`` steps, a loop over chunks only.

    Same arguments and results as ``gla_reference``. Cost O(T C K + T K V) per head. T need not be a multiple of
    chunk_size. With a vector gate the chunk is split into sub-chunks of ``SUBCHUNK`` steps (chunk_size is rounded
    up to a multiple of it).
    """
    fn = "gla_chunk"
    B, T, H, K, V, kind = _check_sequence(q, k, v, log_a, initial_state, reset, fn)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(f"{fn}: chunk_size must be a positive int, got {chunk_size!r}")
    dt = _work_dtype(q, k, v, log_a, initial_state)
    if T == 0:
        s0 = _initial(initial_state, B, H, K, V, dt, q)
        return v.new_zeros((B, 0, H, V)), (s0 if output_final_state else None)

    C = min(chunk_size, T)
    sub = min(SUBCHUNK, C)
    if kind == "vector":
        C = sub * math.ceil(C / sub)
    N = math.ceil(T / C)
    qc, kc, vc = (_to_chunks(x, dt, N, C) for x in (q, k, v))
    la = _gate_chunks(log_a, kind, reset, B, T, H, K, dt, N, C, q.device)
    s0 = _initial(initial_state, B, H, K, V, dt, q)

    if la is None:
        o, states = _chunk_nogate(qc, kc, vc, s0)
    elif la.dim() == 4:
        o, states = _chunk_scalar(qc, kc, vc, la, s0)
    else:
        o, states = _chunk_vector(qc, kc, vc, la, s0, sub)

    o = o.view(B, H, N * C, V)[:, :, :T].transpose(1, 2)
    o = o.to(dtype=v.dtype, memory_format=torch.contiguous_format)
    # A copy, so that holding the final state (e.g. for decoding) does not keep every chunk's state alive.
    return o, (states[:, :, N].clone() if output_final_state else None)


def _chunk_nogate(qc, kc, vc, s0):
    """a = 1 everywhere: causal masking inside chunks, states are a running sum."""
    C = qc.shape[-2]
    causal = torch.ones(C, C, dtype=torch.bool, device=qc.device).tril()
    scores = torch.matmul(qc, kc.transpose(-1, -2)).masked_fill_(~causal, 0.0)
    local = torch.matmul(kc.transpose(-1, -2), vc)  # [B, H, N, K, V]
    states = torch.cat([s0.unsqueeze(2), s0.unsqueeze(2) + local.cumsum(2)], dim=2)
    o = torch.matmul(scores, vc) + torch.matmul(qc, states[:, :, :-1])
    return o, states


def _chunk_scalar(qc, kc, vc, la, s0):
    """One log-gate per head and step. la: [Bg, H, N, C] with Bg in (1, B)."""
    decay = _segsum(la).exp()  # [Bg, H, N, C(t), C(s)], exp(sum over (s, t]), 0 above the diagonal
    b = la.cumsum(-1)  # sum over [chunk start, t]
    scores = torch.matmul(qc, kc.transpose(-1, -2)) * decay
    k_end = kc * decay[..., -1, :].unsqueeze(-1)  # k_s * exp(sum over (s, chunk end])
    local = torch.matmul(k_end.transpose(-1, -2), vc)
    chunk_decay = b[..., -1].exp()[..., None, None]  # [Bg, H, N, 1, 1]
    states = _StateScan.apply(local, chunk_decay, s0)
    q_start = qc * b.exp().unsqueeze(-1)  # q_t * exp(sum over [chunk start, t])
    o = torch.matmul(scores, vc) + torch.matmul(q_start, states[:, :, :-1])
    return o, states


def _chunk_vector(qc, kc, vc, la, s0, sub):
    """One log-gate per key channel. la: [B, H, N, C, K]; sub-chunks of `sub` steps (C % sub == 0)."""
    B, H, N, C, K = qc.shape
    m = C // sub
    q6, k6, la6 = (x.view(B, H, N, m, sub, K) for x in (qc, kc, la))
    beta = la6.cumsum(-2)  # sum over [sub-chunk start, t]
    sigma = _suffix_excl(la6, -2)  # sum over (s, sub-chunk end]
    q_hat = q6 * beta.exp()
    k_til = k6 * sigma.exp()

    a_diag = _DiagScores.apply(q6, k6, la6)  # [B, H, N, m, sub, sub]
    o = torch.matmul(a_diag, vc.view(B, H, N, m, sub, -1)).view(B, H, N, C, -1)

    g = beta[..., -1, :]  # [B, H, N, m, K]: log-decay over each sub-chunk
    if m > 1:
        # gamma[i, j] = sum of g over sub-chunks strictly between j and i (-inf for j >= i)
        seg = _segsum(g.transpose(-1, -2))  # [B, H, N, K, m, m]
        gamma = torch.cat([torch.full_like(seg[..., :1, :], float("-inf")), seg[..., :-1, :]], dim=-2)
        gamma = gamma.permute(0, 1, 2, 4, 5, 3)  # [B, H, N, m(i), m(j), K]
        k_cross = k_til.unsqueeze(3) * gamma.exp().unsqueeze(-2)  # [B, H, N, m(i), m(j), sub, K]
        scores = torch.matmul(q_hat, k_cross.view(B, H, N, m, C, K).transpose(-1, -2))  # [B, H, N, m, sub, C]
        o = o + torch.matmul(scores.view(B, H, N, C, C), vc)
        q_start = (q_hat * _prefix_excl(g, -2).exp().unsqueeze(-2)).view(B, H, N, C, K)
        k_end = (k_til * _suffix_excl(g, -2).exp().unsqueeze(-2)).view(B, H, N, C, K)
    else:
        q_start, k_end = q_hat.view(B, H, N, C, K), k_til.view(B, H, N, C, K)
    local = torch.matmul(k_end.transpose(-1, -2), vc)
    chunk_decay = g.sum(-2).exp().unsqueeze(-1)  # [B, H, N, K, 1]
    states = _StateScan.apply(local, chunk_decay, s0)
    o = o + torch.matmul(q_start, states[:, :, :-1])
    return o, states


def gla(q, k, v, log_a=None, **kw):
    """The op models call: the chunkwise form (``gla_chunk``)."""
    return gla_chunk(q, k, v, log_a, **kw)
