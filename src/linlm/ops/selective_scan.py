"""The Mamba-1 selective scan (S6) in three forms: reference, chunked (training/prefill) and one-step (decode).

One algorithm, the S6 recurrence, in each of its forms (and the entry to the compiled kernel's, with the dispatcher
that picks one), so the file is longer than most: its forms share the argument checks and the dtype rules below.

For every channel d the state s_t[d, :] in R^N follows

    s_t[d, n] = exp(dt_t[d] * A[d, n]) * s_{t-1}[d, n] + dt_t[d] * u_t[d] * B_t[n]
    y_t[d]    = sum_n C_t[n] * s_t[d, n] + D[d] * u_t[d]

Shapes (Bt = batch, T = time, Din = channels, N = state size):
    u, dt          [Bt, T, Din]   dt is already positive (after softplus); with dt_softplus=True (every form) dt is
                                  the pre-activation and the step size is softplus(dt), which the kernel computes
                                  on the fly (no separate pass over dt forward or backward)
    A              [Din, N] or [Bt, Din, N], real and <= 0; the batched form lets MossNet put experts in the batch
    B, C           [Bt, T, N]     shared by all channels
    D              None, [Din] or [Bt, Din]
    initial_state  [Bt, Din, N]
    reset          None or bool [Bt, T]; True at a document's first token: the state is zeroed before that update
    y              [Bt, T, Din] in the dtype of u; state [Bt, Din, N]

Arithmetic is float32 (float64 when u is float64), whatever the input dtype.

How the chunked form works
--------------------------
The decay of S6 depends on (d, n), so the intra-chunk kernel sum_n C_t[n] B_s[n] exp(A[d, n] (c_t[d] - c_s[d])) does
not factor into a matmul: building it costs T * C * Din * N exponentials, C times the work of the scan itself. Instead
the chunked form computes the states s_t themselves, in O(T Din N) work and O(T / C) tensor ops (plus O(log C) per
block), with no Python loop over time steps:

1. Decays a_t = exp(dt_t A) (one exponential per element, every exponent <= 0; a reset token gets a_t = 0 exactly,
   so the state is dropped there) and inputs h_t = dt_t u_t B_t.
2. Inside every chunk of C = 2^k steps, all chunks of a block at once, a Brent-Kung tree scan on (w, h) pairs, w
   starting as the decays: an up-sweep of k levels (pairs, then quads, ... combined into their last step) and a
   down-sweep of k - 1 levels fill in every prefix. Combining segment (w1, h1) into the later (w2, h2) gives
   (w2 w1, h2 + w2 h1). Each level is two in-place ops on strided views of the time axis (rows of Din * N contiguous
   floats), and all levels together touch each element about twice: about 2 passes, against log2(C) for a doubling
   (Hillis-Steele) scan. Afterwards h_t is the state reached from a zero state at the chunk's entry and w_t the
   decay product since that entry. Decays are multiplied, never divided and never exp(+sum): nothing can overflow,
   small products underflow harmlessly to 0, and a product of k decays has a relative error of about k * eps
   whatever the size of the cumulative log-decay (measured over 63 decays after a step of -400: products 1.2e-6,
   exp of differences of a float32 cumsum 1.5e-5).
3. A Python loop over the T / C chunks carries the state: start_{c+1} = h_exit(c) + w_exit(c) * start_c.
4. s_t = h_t + w_t * start(chunk of t), and y_t = <C_t, s_t> is a batched matvec.

The sequence is processed in blocks of whole chunks, each held in a few reusable buffers of about 2^19 elements, so
nothing of size Bt * T * Din * N (let alone T * C * Din * N) is ever allocated. The forward saves its inputs and the
state at each block's entry; the hand-written backward (torch.autograd.Function) walks the blocks from last to first,
recomputes a block's states from its saved entry state, then runs the adjoint g_t = dL/ds_t, which obeys the same
recurrence backwards, g_t = C_t dy_t + a_{t+1} g_{t+1}, through the same chunked scan. Then, per block:
    d(dt u)_t[d] = sum_n g_t B_t          dB_t = sum_d g_t (dt u)_t          dC_t = sum_d dy_t s_t
    dlog a_t     = g_t a_t s_{t-1}        dA = sum_{b,t} dlog a_t dt_t       d dt_t += sum_n dlog a_t A
    d initial_state = a_0 g_0
The backward cannot itself be differentiated (no double backward).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from linlm.errors import ConfigError, ShapeError
from linlm.ops import backends, kernel_library, scan_kernel

__all__ = [
    "selective_scan",
    "selective_scan_chunked",
    "selective_scan_kernel",
    "selective_scan_reference",
    "selective_scan_step",
    "scan_step_unchecked",
]


# ---------------------------------------------------------------------------------------------------------------------
# argument checks


def _shape(t: Tensor | None) -> list[int] | None:
    return None if t is None else list(t.shape)


def _compute_dtype(u: Tensor) -> torch.dtype:
    return torch.float64 if u.dtype == torch.float64 else torch.float32


def _check_scan_args(fn, u, dt, A, B, C, D, state, reset, *, step: bool = False) -> tuple[int, int, int]:
    """Validate shapes; return (Bt, Din, N). In step form u, dt are [Bt, Din] and B, C are [Bt, N]."""
    lead = "[Bt, Din]" if step else "[Bt, T, Din]"
    want_dim = 2 if step else 3
    for name, t in (("u", u), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        if not isinstance(t, Tensor):
            raise ShapeError(f"{fn}: `{name}` must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise ShapeError(f"{fn}: `{name}` must be a floating-point tensor, got dtype {t.dtype}")
    if u.dim() != want_dim:
        raise ShapeError(f"{fn}: `u` must be {lead}, got shape {_shape(u)}")
    if dt.shape != u.shape:
        raise ShapeError(f"{fn}: `dt` must have the shape of `u` {_shape(u)} ({lead}), got {_shape(dt)}")
    Bt, Din = u.shape[0], u.shape[-1]
    if A.dim() == 2:
        if A.shape[0] != Din:
            raise ShapeError(f"{fn}: `A` must be [Din, N] with Din = {Din}, got shape {_shape(A)}")
    elif A.dim() == 3:
        if A.shape[0] != Bt or A.shape[1] != Din:
            raise ShapeError(f"{fn}: batched `A` must be [Bt, Din, N] = [{Bt}, {Din}, N], got shape {_shape(A)}")
    else:
        raise ShapeError(f"{fn}: `A` must be [Din, N] or [Bt, Din, N], got shape {_shape(A)}")
    N = A.shape[-1]
    bc_shape = [Bt, N] if step else [Bt, u.shape[1], N]
    bc_text = "[Bt, N]" if step else "[Bt, T, N]"
    for name, t in (("B", B), ("C", C)):
        if list(t.shape) != bc_shape:
            raise ShapeError(f"{fn}: `{name}` must be {bc_text} = {bc_shape} (N from `A`), got {_shape(t)}")
    if D is not None:
        if not isinstance(D, Tensor) or list(D.shape) not in ([Din], [Bt, Din]):
            raise ShapeError(f"{fn}: `D` must be None, [Din] = [{Din}] or [Bt, Din] = [{Bt}, {Din}], got {_shape(D)}")
    state_name = "state" if step else "initial_state"
    if state is not None:
        if not isinstance(state, Tensor) or list(state.shape) != [Bt, Din, N]:
            raise ShapeError(f"{fn}: `{state_name}` must be [Bt, Din, N] = {[Bt, Din, N]}, got {_shape(state)}")
    if reset is not None:
        if not isinstance(reset, Tensor) or list(reset.shape) != [Bt, u.shape[1]]:
            raise ShapeError(f"{fn}: `reset` must be None or [Bt, T] = {[Bt, u.shape[1]]}, got {_shape(reset)}")
        if reset.dtype != torch.bool:
            raise ShapeError(
                f"{fn}: `reset` must be a bool tensor (True at a document's first token), got {reset.dtype}"
            )
    return Bt, Din, N


def _check_scan_values(fn: str, dt: Tensor | None, A: Tensor) -> None:
    """dt * A must be <= 0, or exp(dt * A) grows without bound. Cheap next to the scan itself. dt None: not checked
    (a softplus pre-activation). (Skipped while torch.export traces: a graph cannot branch on values.)"""
    if torch.compiler.is_exporting():
        return
    # One reduction each (no boolean temporary of dt's size); a NaN fails neither test, as before.
    if A.numel() and float(A.detach().max()) > 0:
        raise ShapeError(f"{fn}: `A` must be <= 0 (A = -exp(A_log)), got a maximum of {A.max().item():.4g}")
    if dt is not None and dt.numel() and float(dt.detach().min()) < 0:
        raise ShapeError(
            f"{fn}: `dt` must be >= 0 (apply softplus first), got a minimum of {dt.min().item():.4g}"
        )


def _activate_dt(dt: Tensor, cd: torch.dtype, dt_softplus: bool) -> Tensor:
    """dt in the compute dtype; softplus(dt) when dt is the pre-activation."""
    dt = dt.to(cd)
    return F.softplus(dt) if dt_softplus else dt


def _broadcast_A(A: Tensor) -> Tensor:
    """[Din, N] -> [1, 1, Din, N]; [Bt, Din, N] -> [Bt, 1, Din, N], to meet dt[..., None] of shape [Bt, T, Din, 1]."""
    return A[None, None] if A.dim() == 2 else A[:, None]


def _add_skip(y: Tensor, u: Tensor, D: Tensor | None) -> Tensor:
    """y + D * u for D of shape [Din] or [Bt, Din] (u is [Bt, T, Din] or [Bt, Din])."""
    if D is None:
        return y
    D = D.to(y.dtype)
    if D.dim() == 2 and u.dim() == 3:
        D = D[:, None]
    return y + D * u.to(y.dtype)


# ---------------------------------------------------------------------------------------------------------------------
# one step: the decode form, and the body of the reference loop


def _step_update(s: Tensor, u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor) -> tuple[Tensor, Tensor]:
    """One recurrence step, no skip term. u, dt [Bt, Din]; A [Din, N] or [Bt, Din, N]; B, C [Bt, N]; s [Bt, Din, N]."""
    decay = torch.exp(dt[:, :, None] * A)
    s = decay * s + (dt * u)[:, :, None] * B[:, None, :]
    y = torch.einsum("bdn,bn->bd", s, C)
    return y, s


def selective_scan_step(u, dt, A, B, C, D=None, *, state=None, dt_softplus=False) -> tuple[Tensor, Tensor]:
    """Advance the scan by one token. u, dt [Bt, Din]; B, C [Bt, N]; state [Bt, Din, N] or None (zeros).

    Returns (y [Bt, Din] in u's dtype, new_state [Bt, Din, N] in float32, float64 for float64 u).
    Memory is O(Bt Din N) whatever the context length.
    """
    fn = "selective_scan_step"
    Bt, Din, N = _check_scan_args(fn, u, dt, A, B, C, D, state, None, step=True)
    if state is None:
        state = torch.zeros(Bt, Din, N, dtype=_compute_dtype(u), device=u.device)
    return scan_step_unchecked(u, dt, A, B, C, D, state, dt_softplus)


def scan_step_unchecked(u, dt, A, B, C, D, state, dt_softplus: bool) -> tuple[Tensor, Tensor]:
    """:func:`selective_scan_step` without its argument checks, for a caller that built the arguments itself (a
    model's decoding step, where the checks cost as much as the arithmetic). ``state`` is required, and every
    tensor has the shapes above. A fresh state is returned (the given one is not changed); in the compute dtype the
    step is eight tensor ops:

        dt = softplus(dt);  s' = exp(dt A) * s + (dt u) B;  y = s' C + D u
    """
    cd = _compute_dtype(u)
    uc, dt = _as(u, cd), _as(dt, cd)
    if dt_softplus:
        dt = F.softplus(dt)
    decay = torch.exp(dt.unsqueeze(-1) * _as(A, cd))
    s = decay.mul_(_as(state, cd))
    s.addcmul_((dt * uc).unsqueeze(-1), _as(B, cd).unsqueeze(1))
    y = torch.bmm(s, _as(C, cd).unsqueeze(-1)).squeeze(-1)
    if D is not None:
        y.addcmul_(uc, _as(D, cd))
    return _as(y, u.dtype), s


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    """t in dtype; t itself when it already is (a dtype test costs a tenth of a no-op ``.to``)."""
    return t if t.dtype == dtype else t.to(dtype)


# ---------------------------------------------------------------------------------------------------------------------
# reference: the definition, a loop over time


def selective_scan_reference(
    u, dt, A, B, C, D=None, *, initial_state=None, reset=None, output_final_state=True, dt_softplus=False
) -> tuple[Tensor, Tensor | None]:
    """The sequential definition of the scan, one step per token. Slow; used to check the other forms."""
    fn = "selective_scan_reference"
    Bt, Din, N = _check_scan_args(fn, u, dt, A, B, C, D, initial_state, reset)
    cd = _compute_dtype(u)
    dt = _activate_dt(dt, cd, dt_softplus)
    _check_scan_values(fn, dt, A)
    uc, dtc, Ac, Bc, Cc = (t.to(cd) for t in (u, dt, A, B, C))
    s = torch.zeros(Bt, Din, N, dtype=cd, device=u.device) if initial_state is None else initial_state.to(cd)
    ys = []
    for t in range(u.shape[1]):
        if reset is not None:
            s = torch.where(reset[:, t, None, None], torch.zeros_like(s), s)
        y_t, s = _step_update(s, uc[:, t], dtc[:, t], Ac, Bc[:, t], Cc[:, t])
        ys.append(y_t)
    y = torch.stack(ys, dim=1) if ys else uc.new_zeros(Bt, 0, Din)
    y = _add_skip(y, uc, D).to(u.dtype)
    return y, (s if output_final_state else None)


# ---------------------------------------------------------------------------------------------------------------------
# chunked: a tree scan inside chunks, a loop over chunks between them, blocks of chunks to bound memory

# Elements per block buffer (Bt * steps * Din * N); a block of steps is processed in a few such buffers. 2 MiB in
# float32: far under glibc's mmap threshold, so they are recycled rather than page-faulted in on every call, and mostly
# in cache during the scan's passes.
_BLOCK_ELEMS = 1 << 19


@functools.lru_cache(maxsize=None)
def _tree_levels(chunk: int, reverse: bool) -> tuple[tuple[slice, slice], ...]:
    """(target, source) position slices of a Brent-Kung scan over a chunk of chunk = 2^k steps.

    Forward, the up-sweep combines t = s-1, 2s-1, ... with t - s/2 for s = 2, 4, ..., chunk, which leaves the full
    chunk at its last position; the down-sweep then combines t = 3s/2-1, 5s/2-1, ... with t - s/2 for
    s = chunk/2, ..., 2, which completes every other prefix. Targets and sources of a level are disjoint, so each level
    is two in-place ops. Reverse mirrors every position (t -> chunk-1-t).
    """
    levels = []
    s = 2
    while s <= chunk:
        levels.append((range(s - 1, chunk, s), range(s // 2 - 1, chunk, s)))
        s *= 2
    s = chunk // 2
    while s >= 2:
        levels.append((range(3 * s // 2 - 1, chunk, s), range(s - 1, chunk - s // 2, s)))
        s //= 2
    out = []
    for tgt, src in levels:
        assert len(tgt) == len(src) > 0
        if reverse:
            tgt, src = (range(chunk - 1 - r[-1], chunk - r[0], r.step) for r in (tgt, src))
        out.append((slice(tgt.start, tgt.stop, tgt.step), slice(src.start, src.stop, src.step)))
    return tuple(out)


def _linear_scan_block(w: Tensor, h: Tensor, carry: Tensor, chunk: int, reverse: bool) -> tuple[Tensor, Tensor]:
    """Solve h_t <- h_t + w_t * h_{t-1} (reverse: h_t <- h_t + w_t * h_{t+1}) over one block, from state `carry`.

    w, h: [Bt, L, Din, N] contiguous, L a multiple of chunk (a power of two); w holds the decays, h the inputs, and both
    are overwritten: h with the states, w with decay products. carry: [Bt, Din, N], the state before the block's first
    step (after its last step when reverse). Returns (h, the carry after the block).
    """
    Bt, L, Din, N = h.shape
    n_chunks = L // chunk
    w5, h5 = w.view(Bt, n_chunks, chunk, Din, N), h.view(Bt, n_chunks, chunk, Din, N)
    for tgt, src in _tree_levels(chunk, reverse):
        # combine the segment ending at src (w, h) into the one at tgt: h <- h + w h_src, then w <- w w_src
        h5[:, :, tgt].addcmul_(w5[:, :, tgt], h5[:, :, src])
        w5[:, :, tgt].mul_(w5[:, :, src])
    # h5[:, c, i]: the state reached from a zero state at chunk c's entry; w5[:, c, i]: the decay product since then.
    starts = h5.new_empty(Bt, n_chunks, Din, N)
    exit_pos = 0 if reverse else chunk - 1
    for c in range(n_chunks - 1, -1, -1) if reverse else range(n_chunks):
        starts[:, c] = carry
        carry = torch.addcmul(h5[:, c, exit_pos], w5[:, c, exit_pos], carry)
    h5.addcmul_(w5, starts[:, :, None])
    return h, carry


class _Blocks:
    """Block layout of a padded sequence and the reusable buffers that hold one block of [Bt, L, Din, N]."""

    def __init__(self, ref: Tensor, Bt: int, Tp: int, Din: int, N: int, chunk: int, n_buffers: int):
        per_step = Bt * Din * N
        self.size = max(chunk, (_BLOCK_ELEMS // (per_step * chunk)) * chunk)
        self.size = min(self.size, Tp)
        self.bounds = [(t0, min(t0 + self.size, Tp)) for t0 in range(0, Tp, self.size)]
        self.shape = (Bt, Din, N)
        self._flat = [ref.new_empty(per_step * self.size) for _ in range(n_buffers)]

    def buffers(self, L: int) -> list[Tensor]:
        Bt, Din, N = self.shape
        return [f[: Bt * L * Din * N].view(Bt, L, Din, N) for f in self._flat]


def _block_decay(dt: Tensor, A4: Tensor, reset: Tensor | None, t0: int, t1: int, out: Tensor) -> Tensor:
    """out <- exp(dt_t * A) for t in [t0, t1), zero where reset (the state is dropped before that step)."""
    torch.mul(dt[:, t0:t1, :, None], A4, out=out)
    out.exp_()
    if reset is not None:
        out.masked_fill_(reset[:, t0:t1, None, None], 0.0)
    return out


def _block_states(dt, x, A4, B, reset, t0, t1, carry, chunk, bufs, decay=None) -> tuple[Tensor, Tensor]:
    """States s_t for t in [t0, t1) from the state `carry` before t0, written into bufs[1]. Returns (states, carry).

    bufs: 2 block buffers (decays, then inputs). decay: the block's decays if already computed (copied, not
    overwritten), else they are computed.
    """
    w, h = bufs
    if decay is None:
        _block_decay(dt, A4, reset, t0, t1, w)
    else:
        w.copy_(decay)
    torch.mul(x[:, t0:t1, :, None], B[:, t0:t1, None, :], out=h)
    return _linear_scan_block(w, h, carry, chunk, reverse=False)


class _ChunkedScan(torch.autograd.Function):
    """y (without the D skip) and the final state, with a hand-written backward. Inputs already in compute dtype.

    Saves the inputs and one state per block; the backward recomputes a block's states from it, then runs the
    adjoint scan over that block, so no tensor of size Bt * T * Din * N is ever kept.
    """

    @staticmethod
    def forward(ctx, u, dt, A, B, C, init, reset, chunk):
        ctx.set_materialize_grads(False)
        Bt, T, Din = u.shape
        N = A.shape[-1]
        pad = (-T) % chunk
        if pad:  # padded steps have dt = 0: decay 1 and input 0, so the state passes through them unchanged
            u, dt = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (u, dt))
            B, C = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (B, C))
            if reset is not None:
                reset = torch.nn.functional.pad(reset, (0, pad), value=False)
        Tp = T + pad
        A4, x = _broadcast_A(A), dt * u
        blocks = _Blocks(u, Bt, Tp, Din, N, chunk, n_buffers=2)
        carry = u.new_zeros(Bt, Din, N) if init is None else init
        starts = u.new_empty(Bt, len(blocks.bounds), Din, N)
        y = u.new_empty(Bt, Tp, Din)
        for i, (t0, t1) in enumerate(blocks.bounds):
            starts[:, i] = carry
            states, carry = _block_states(dt, x, A4, B, reset, t0, t1, carry, chunk, blocks.buffers(t1 - t0))
            y[:, t0:t1] = torch.einsum("btdn,btn->btd", states, C[:, t0:t1])
        ctx.save_for_backward(u, dt, A, B, C, reset, starts)
        ctx.T, ctx.chunk = T, chunk
        return y[:, :T], carry

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dfinal):
        u, dt, A, B, C, reset, starts = ctx.saved_tensors
        T, chunk = ctx.T, ctx.chunk
        Bt, Tp, Din = u.shape
        N = A.shape[-1]
        need_u, need_dt, need_A, need_B, need_C, need_init = ctx.needs_input_grad[:6]
        if dy is None:
            dy = u.new_zeros(Bt, Tp, Din)
        elif Tp != T:
            dy = torch.nn.functional.pad(dy, (0, 0, 0, Tp - T))
        A4, x = _broadcast_A(A), dt * u
        batched_A = A.dim() == 3
        blocks = _Blocks(u, Bt, Tp, Din, N, chunk, n_buffers=4)
        du = torch.zeros_like(u) if need_u else None
        ddt = torch.zeros_like(dt) if need_dt else None
        dA = torch.zeros_like(A) if need_A else None
        dB = torch.zeros_like(B) if need_B else None
        dC = torch.zeros_like(C) if need_C else None
        # The adjoint g_t = dL/ds_t obeys g_t = C_t dy_t + a_{t+1} g_{t+1}; g_carry is g at the step after the block
        # (dfinal after the last step, where padded steps have a = 1 and dy = 0).
        g_carry = u.new_zeros(Bt, Din, N) if dfinal is None else dfinal
        for i in range(len(blocks.bounds) - 1, -1, -1):
            t0, t1 = blocks.bounds[i]
            decay, w, h, g = blocks.buffers(t1 - t0)
            # states of this block, recomputed from the saved block-start state
            _block_decay(dt, A4, reset, t0, t1, decay)
            states, _ = _block_states(dt, x, A4, B, reset, t0, t1, starts[:, i], chunk, (w, h), decay=decay)
            # adjoint scan over the block: w_t = a_{t+1} (a at the next block's first step for the last t)
            w[:, :-1] = decay[:, 1:]
            if t1 < Tp:
                w[:, -1] = _block_decay(dt, A4, reset, t1, t1 + 1, g[:, :1])[:, 0]
            else:
                w[:, -1] = 1.0
            torch.mul(dy[:, t0:t1, :, None], C[:, t0:t1, None, :], out=g)
            g, g_carry = _linear_scan_block(w, g, g_carry, chunk, reverse=True)
            if need_C:
                dC[:, t0:t1] = torch.einsum("btdn,btd->btn", states, dy[:, t0:t1])
            if need_u or need_dt:
                dx = torch.einsum("btdn,btn->btd", g, B[:, t0:t1])  # dL/d(dt u)
                if need_u:
                    du[:, t0:t1] = dx * dt[:, t0:t1]
                if need_dt:
                    ddt[:, t0:t1] = dx * u[:, t0:t1]
            if need_B:
                dB[:, t0:t1] = torch.einsum("btdn,btd->btn", g, x[:, t0:t1])
            # g_t a_t is dL/ds_{t-1} through step t; times s_{t-1} it is dL/d(log a_t), log a_t = dt_t A.
            ga = torch.mul(g, decay, out=w)
            if i == 0 and need_init:
                d_init = ga[:, 0].clone()
            if need_dt or need_A:
                dlog = ga
                dlog[:, 1:] *= states[:, :-1]
                dlog[:, 0] *= starts[:, i]
                if need_dt:
                    eq = "btdn,bdn->btd" if batched_A else "btdn,dn->btd"
                    ddt[:, t0:t1] += torch.einsum(eq, dlog, A)
                if need_A:
                    dlog *= dt[:, t0:t1, :, None]
                    dA += dlog.sum(1) if batched_A else dlog.sum((0, 1))
        return (
            du[:, :T] if need_u else None,
            ddt[:, :T] if need_dt else None,
            dA,
            dB[:, :T] if need_B else None,
            dC[:, :T] if need_C else None,
            d_init if need_init else None,
            None,
            None,
        )


def selective_scan_chunked(
    u, dt, A, B, C, D=None, *, initial_state=None, reset=None, output_final_state=True, chunk_size=64,
    dt_softplus=False,
) -> tuple[Tensor, Tensor | None]:
    """The chunked scan: same result as selective_scan_reference, for training and prefill.

    chunk_size: steps per chunk, any positive int, rounded down to a power of two (and to T); the last chunk is
    padded. Work is about the same for any chunk size; the loop between chunks takes T / chunk_size small steps,
    the tree log2(chunk_size) levels. benchmarks/bench_scan.py measures the chunk sizes against each other (its
    sweep).
    """
    fn = "selective_scan_chunked"
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(f"{fn}: `chunk_size` must be a positive int, got {chunk_size!r}")
    Bt, Din, N = _check_scan_args(fn, u, dt, A, B, C, D, initial_state, reset)
    T = u.shape[1]
    cd = _compute_dtype(u)
    dt = _activate_dt(dt, cd, dt_softplus)
    _check_scan_values(fn, dt, A)
    if T == 0:
        s = torch.zeros(Bt, Din, N, dtype=cd, device=u.device) if initial_state is None else initial_state.to(cd)
        return u.new_zeros(Bt, 0, Din), (s if output_final_state else None)
    chunk = 1 << (min(chunk_size, T).bit_length() - 1)  # the tree scan wants a power of two
    uc, dtc, Ac, Bc, Cc = (t.to(cd) for t in (u, dt, A, B, C))
    init = None if initial_state is None else initial_state.to(cd)
    y, final = _ChunkedScan.apply(uc, dtc, Ac, Bc, Cc, init, reset, chunk)
    y = _add_skip(y, uc, D).to(u.dtype)
    return y, (final if output_final_state else None)


def selective_scan_kernel(
    u, dt, A, B, C, D=None, *, initial_state=None, reset=None, output_final_state=True, lengths=None,
    dt_softplus=False,
) -> tuple[Tensor, Tensor | None]:
    """The compiled CPU kernel (linlm.ops.scan_kernel): same result as selective_scan_reference, one pass over the
    sequence per direction, states checkpointed every 64 steps for the backward. Raises ConfigError when the kernel
    cannot be built (see kernel_library.available).

    lengths: None, or int [Bt]: row b ends after lengths[b] steps and the rest is padding that is skipped (y there is
    D u; the final state is the one after step lengths[b] - 1). The same as the reference on each row's prefix.
    """
    fn = "selective_scan_kernel"
    Bt, Din, N = _check_scan_args(fn, u, dt, A, B, C, D, initial_state, reset)
    _check_scan_values(fn, None if dt_softplus else dt, A)
    if u.device.type != "cpu":
        raise ShapeError(f"{fn}: the kernel runs on the CPU, got `u` on {u.device}; use selective_scan_chunked")
    if N > scan_kernel.MAX_STATE:
        raise ShapeError(f"{fn}: the kernel takes a state size N of at most {scan_kernel.MAX_STATE}, got N = {N} "
                         f"(from `A`); use selective_scan_chunked")
    if not kernel_library.available():
        raise ConfigError(f"{fn}: the selective-scan kernel is not available (no C compiler, the build failed, or "
                          f"LINLM_SCAN_BACKEND=torch); use selective_scan_chunked")
    cd = _compute_dtype(u)
    if u.shape[1] == 0:
        s = torch.zeros(Bt, Din, N, dtype=cd, device=u.device) if initial_state is None else initial_state.to(cd)
        return u.new_zeros(Bt, 0, Din), (s if output_final_state else None)
    # u (so y and du) is read and written in its own dtype where the kernel has a variant for it (bfloat16: in
    # place, computing in float32; the same values as converting around a float32 kernel), the rest in float32
    io = u.dtype if u.dtype in kernel_library.IO_DTYPES else cd
    uc = u.to(io)
    dtc, Ac, Bc, Cc = (t.to(cd) for t in (dt, A, B, C))
    init = None if initial_state is None else initial_state.to(cd)
    if lengths is not None and (not isinstance(lengths, Tensor) or list(lengths.shape) != [Bt]
                                or lengths.is_floating_point()):
        raise ShapeError(f"{fn}: `lengths` must be None or an integer tensor [Bt] = [{Bt}], got {_shape(lengths)}")
    y, final = scan_kernel.kernel_scan(uc, dtc, Ac, Bc, Cc, D, init, reset, lengths, dt_softplus=bool(dt_softplus))
    return y.to(u.dtype), (final if output_final_state else None)


def selective_scan(u, dt, A, B, C, D=None, *, chunk_size=64, lengths=None, dt_softplus=False,
                   **kw) -> tuple[Tensor, Tensor | None]:
    """The scan models call: the compiled kernel on the CPU when it is available (kernel_library.available());
    on CUDA, mamba_ssm's selective_scan_fn when it is installed and takes the case (linlm.ops.backends says which
    cases; LINLM_GPU_KERNELS=torch turns it off); else the chunked form. Keywords as selective_scan_kernel;
    chunk_size only matters to the chunked form. Off the CPU kernel, `lengths` runs as dt = 0 and C = 0 on the
    padding (the same result, at the cost of scanning the padding)."""
    if (isinstance(u, Tensor) and u.device.type == "cpu" and isinstance(A, Tensor)
            and A.shape[-1] <= scan_kernel.MAX_STATE and kernel_library.available()):
        return selective_scan_kernel(u, dt, A, B, C, D, lengths=lengths, dt_softplus=dt_softplus, **kw)
    if lengths is not None:
        if dt_softplus:  # activated first, so that the padding gets dt = 0
            dt, dt_softplus = _activate_dt(dt, _compute_dtype(u), True), False
        valid = (torch.arange(u.shape[1], device=u.device) < lengths.to(u.device)[:, None])[..., None]
        dt, C = dt * valid, C * valid
    if backends.on_gpu(u):
        fn = "selective_scan"
        _check_scan_args(fn, u, dt, A, B, C, D, kw.get("initial_state"), kw.get("reset"))
        _check_scan_values(fn, None if dt_softplus else dt, A)
        out = backends.selective_scan(u, dt, A, B, C, D, dt_softplus=dt_softplus, **kw)
        if out is not None:
            return out
    return selective_scan_chunked(u, dt, A, B, C, D, chunk_size=chunk_size, dt_softplus=dt_softplus, **kw)
