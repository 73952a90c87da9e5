"""The element-wise work of a decoding step on the compiled CPU kernel (``_step_kernel.c``, loaded by
linlm.ops.kernel_library), without autograd: a short conv's step with its SiLU, and a Mamba mixer's scan step with
its dt projection, softplus, skip term and output gate, each one call where torch takes five and about fifteen ops.

At batch 1 each of those ops costs more in dispatch than in arithmetic (a 24-layer Mamba's step spent about a
quarter of its time there), so a step runs each on the kernel when every tensor is a float32 CPU tensor with the
layout the kernel reads, no gradient is wanted, and no graph is being traced (torch.jit, torch.compile,
torch.export); anything else keeps the torch ops, which compute the same values (benchmarks/bench_llamacpp.py times
decoding with the kernels and without them, ``LINLM_SCAN_BACKEND=torch``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from linlm.ops import kernel_library, kernel_threads
from linlm.ops.gemv_kernel import GEMV_MAX_ROWS, Q8_MAX_K
from linlm.ops.kernel_entries import STEP_FIELDS, MambaModelStep
from linlm.ops.kernel_library import EntryPoint, entry_point

__all__ = ["STEP_CH", "RMS_MAX_ROWS", "STEP_FIELDS", "conv_step", "conv_step_takes", "mamba_mixer_step",
           "mamba_mixer_step_takes", "mamba_model_step", "mamba_step", "mamba_step_takes", "projection_takes",
           "rms_rows", "rms_rows_takes"]

STEP_CH = 64  # channels per work item; must equal STEP_CH in the C source
RMS_MAX_ROWS = 8  # the norm of more rows than this (a prefill, training) keeps torch's ops


@entry_point("conv_step")
class ConvStep(EntryPoint):
    """out [Bt, C] and new_st [Bt, K - 1, C] from x [Bt, C] (row stride xs), st [Bt, K - 1, C] (batch stride ss),
    w [C, K], bias."""

    x: Tensor
    xs: int
    st: Tensor
    ss: int
    w: Tensor
    bias: Optional[Tensor]
    out: Tensor
    new_st: Tensor
    Bt: int
    C: int
    K: int
    silu: bool


@entry_point("mamba_step")
class MambaStep(EntryPoint):
    """y [Bt, Din] and s_out [Bt, Din, N] from u, the x_proj output xp (rows of dt_low, B and C; row stride xs), z,
    the dt projection, A, D and the state s."""

    u: Tensor
    xp: Tensor
    xs: int
    z: Optional[Tensor]
    zs: int
    dt_w: Tensor
    dt_b: Optional[Tensor]
    A: Tensor
    D: Optional[Tensor]
    s: Tensor
    s_out: Tensor
    y: Tensor
    Bt: int
    Din: int
    N: int
    R: int


@entry_point("mamba_mixer_step", scratch="xq")
class MambaMixerStep(EntryPoint):
    """A Mamba mixer's whole step: out [Bt, d], new_st and s_out from x [Bt, d], the conv window st (batch stride
    ss), the scan state s and the mixer's weights (a projection's sc: its int8 weight's row scales, None for a
    float32 weight); work [Bt (4 Din + R + 2N)] and xq (per thread, Bt max(d, Din) int8) are scratch."""

    x: Tensor
    w_in: Tensor
    sc_in: Optional[Tensor]
    b_in: Optional[Tensor]
    st: Tensor
    ss: int
    conv_w: Tensor
    conv_b: Optional[Tensor]
    w_x: Tensor
    sc_x: Optional[Tensor]
    b_x: Optional[Tensor]
    dt_w: Tensor
    dt_b: Optional[Tensor]
    A: Tensor
    D: Optional[Tensor]
    w_out: Tensor
    sc_out: Optional[Tensor]
    b_out: Optional[Tensor]
    s: Tensor
    work: Tensor
    xq: Tensor
    new_st: Tensor
    s_out: Tensor
    out: Tensor
    Bt: int
    d: int
    Din: int
    N: int
    R: int
    K: int


@entry_point("rms_rows")
class RmsRows(EntryPoint):
    """y [M, F] = RMSNorm of the rows of x [M, F] with weight w [F] (None: no weight)."""

    x: Tensor
    w: Optional[Tensor]
    y: Tensor
    F: int
    eps: float


def _plain(*tensors: Optional[Tensor]) -> bool:
    """Every tensor given is a float32 CPU tensor with storage; none wants a gradient (while grad is enabled)."""
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if t.dtype != torch.float32 or not t.is_cpu or (grad and t.requires_grad):
            return False
    return True


def _rows(t: Tensor, width: int) -> bool:
    """t is [Bt, width] with contiguous rows (any row stride)."""
    return t.dim() == 2 and t.shape[1] == width and (t.stride(1) == 1 or width == 1)


def _vector(t: Optional[Tensor], n: int) -> bool:
    return t is None or (t.shape == (n,) and t.is_contiguous())


def _window(state: Tensor) -> bool:
    """Each batch row of state [Bt, K - 1, C] is contiguous (the view of a longer window that ShortConv's torch
    forms return is, at any batch stride)."""
    return (state.stride(2) == 1 or state.shape[2] == 1) and (state.stride(1) == state.shape[2] or state.shape[1] == 1)


def _free() -> bool:
    """No graph is traced and the kernel library is built (and not switched off)."""
    return not torch.jit.is_tracing() and kernel_library.available()


def conv_step_takes(x: Tensor, state: Tensor, weight: Tensor, bias: Optional[Tensor]) -> bool:
    """Whether :func:`conv_step` computes ShortConv.step for these tensors."""
    if x.dim() != 2 or weight.dim() != 2:
        return False
    (Bt, C), K = x.shape, weight.shape[1]
    return (K >= 2 and _plain(x, state, weight, bias) and _rows(x, C) and weight.shape == (C, K)
            and weight.is_contiguous() and state.shape == (Bt, K - 1, C) and _window(state)
            and _vector(bias, C) and _free())


def conv_step(x: Tensor, state: Tensor, weight: Tensor, bias: Optional[Tensor], silu: bool) -> tuple[Tensor, Tensor]:
    """(out [Bt, C], new_state [Bt, K - 1, C]) of ShortConv.step, for tensors that conv_step_takes. The new state
    is a fresh tensor; ``state`` is not changed."""
    (Bt, C), K = x.shape, weight.shape[1]
    out = torch.empty(Bt, C)
    new_state = torch.empty(Bt, K - 1, C)
    call = ConvStep(x=x, xs=x.stride(0), st=state, ss=state.stride(0), w=weight, bias=bias, out=out,
                    new_st=new_state, Bt=Bt, C=C, K=K, silu=silu)
    kernel_threads.run(call, torch.float32, Bt * -(-C // STEP_CH))
    return out, new_state


def mamba_step_takes(u: Tensor, xproj: Tensor, z: Optional[Tensor], dt_weight: Tensor, dt_bias: Optional[Tensor],
                     A: Tensor, D: Optional[Tensor], state: Tensor) -> bool:
    """Whether :func:`mamba_step` computes a Mamba mixer's scan step for these tensors: u [Bt, Din] contiguous,
    xproj [Bt, R + 2N] with contiguous rows, z [Bt, Din] with contiguous rows (or None), dt_weight [Din, R],
    A [Din, N], dt_bias and D [Din] (or None), state [Bt, Din, N], all float32 and contiguous."""
    if u.dim() != 2 or A.dim() != 2 or dt_weight.dim() != 2:
        return False
    (Bt, Din), (_, N), R = u.shape, A.shape, dt_weight.shape[1]
    return (_plain(u, xproj, z, dt_weight, dt_bias, A, D, state) and u.is_contiguous() and _rows(xproj, R + 2 * N)
            and xproj.shape[0] == Bt and (z is None or (_rows(z, Din) and z.shape[0] == Bt))
            and dt_weight.shape[0] == Din and dt_weight.is_contiguous() and A.shape[0] == Din and A.is_contiguous()
            and _vector(dt_bias, Din) and _vector(D, Din) and state.shape == (Bt, Din, N) and state.is_contiguous()
            and _free())


def mamba_step(u: Tensor, xproj: Tensor, z: Optional[Tensor], dt_weight: Tensor, dt_bias: Optional[Tensor],
               A: Tensor, D: Optional[Tensor], state: Tensor) -> tuple[Tensor, Tensor]:
    """(y [Bt, Din], new_state [Bt, Din, N]) for tensors that mamba_step_takes, where xproj's rows are
    [dt_low (R), B (N), C (N)]:

        dt = softplus(dt_low dt_weight^T + dt_bias);  s' = exp(dt A) s + (dt u) B;  y = (s' C + D u) silu(z)

    The new state is a fresh tensor; ``state`` is not changed."""
    (Bt, Din), (_, N), R = u.shape, A.shape, dt_weight.shape[1]
    y = torch.empty(Bt, Din)
    new_state = torch.empty(Bt, Din, N)
    call = MambaStep(u=u, xp=xproj, xs=xproj.stride(0), z=z,
                     zs=0 if z is None else z.stride(0), dt_w=dt_weight, dt_b=dt_bias, A=A, D=D, s=state,
                     s_out=new_state, y=y, Bt=Bt, Din=Din, N=N, R=R)
    kernel_threads.run(call, torch.float32, Bt * -(-Din // STEP_CH))
    return y, new_state


def rms_rows_takes(x: Tensor, weight: Optional[Tensor]) -> bool:
    """Whether :func:`rms_rows` computes rms_norm(x, weight, eps): x float32 and contiguous, of at most RMS_MAX_ROWS
    rows of its last dimension, weight [F] or None, no gradient wanted, no graph traced."""
    return (x.dim() >= 1 and 0 < x.numel() <= RMS_MAX_ROWS * x.shape[-1] and _plain(x, weight) and x.is_contiguous()
            and _vector(weight, x.shape[-1]) and _free())


def rms_rows(x: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
    """x / sqrt(mean(x^2, -1) + eps) * weight for tensors that rms_rows_takes (a new tensor of x's shape)."""
    F = x.shape[-1]
    y = torch.empty_like(x)
    kernel_threads.run(RmsRows(x=x, w=weight, y=y, F=F, eps=float(eps)), torch.float32, x.numel() // F)
    return y


Projection = tuple[Tensor, Optional[Tensor], Optional[Tensor]]  # (weight, its int8 row scales or None, bias)


def mamba_mixer_step_takes(x: Tensor, in_proj: Projection, conv_state: Tensor, conv_w: Tensor,
                           conv_b: Optional[Tensor], x_proj: Projection, dt_w: Tensor, dt_b: Optional[Tensor],
                           A: Tensor, D: Optional[Tensor], out_proj: Projection, state: Tensor) -> bool:
    """Whether :func:`mamba_mixer_step` computes a Mamba mixer's step for these tensors: x [Bt, d] of at most
    GEMV_MAX_ROWS rows; the projections in_proj [2 Din, d], x_proj [R + 2N, Din] and out_proj [d, Din], each
    (weight, None, bias) with a float32 weight or (q, s, bias) with an int8 weight q and its float32 row scales s;
    the conv's window [Bt, K - 1, Din] (K >= 2) and weights [Din, K]; dt_w [Din, R], A [Din, N], D [Din] or None;
    the scan state [Bt, Din, N]; biases [rows] or None; float32 and contiguous (the window: each batch row), no
    gradient wanted."""
    if x.dim() != 2 or A.dim() != 2 or dt_w.dim() != 2 or conv_w.dim() != 2:
        return False
    (Bt, d), (Din, N), R, K = x.shape, A.shape, dt_w.shape[1], conv_w.shape[1]
    return (0 < Bt <= GEMV_MAX_ROWS and K >= 2 and projection_takes(in_proj, 2 * Din, d)
            and projection_takes(x_proj, R + 2 * N, Din) and projection_takes(out_proj, d, Din)
            and _plain(x, conv_state, conv_w, conv_b, dt_w, dt_b, A, D, state) and x.is_contiguous()
            and _matrix(conv_w, Din, K) and _matrix(dt_w, Din, R) and A.is_contiguous() and _vector(conv_b, Din)
            and _vector(dt_b, Din) and _vector(D, Din) and conv_state.shape == (Bt, K - 1, Din)
            and _window(conv_state) and state.shape == (Bt, Din, N) and state.is_contiguous() and _free())


def mamba_mixer_step(x: Tensor, in_proj: Projection, conv_state: Tensor, conv_w: Tensor, conv_b: Optional[Tensor],
                     x_proj: Projection, dt_w: Tensor, dt_b: Optional[Tensor], A: Tensor, D: Optional[Tensor],
                     out_proj: Projection, state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(out [Bt, d], new conv window [Bt, K - 1, Din], new scan state [Bt, Din, N]) of a Mamba mixer's step, for
    tensors that mamba_mixer_step_takes: in_proj, the conv's step with SiLU, x_proj, :func:`mamba_step` with the
    gate z (in_proj's second half) and out_proj, in one call. Fresh outputs; the given states are not changed."""
    (Bt, d), (Din, N), R, K = x.shape, A.shape, dt_w.shape[1], conv_w.shape[1]
    par, threads = _team(MambaMixerStep)
    work = torch.empty(Bt * (4 * Din + R + 2 * N))
    xq = _int8_scratch(threads, Bt * max(d, Din), (in_proj, x_proj, out_proj))
    out, new_conv, new_state = torch.empty(Bt, d), torch.empty(Bt, K - 1, Din), torch.empty(Bt, Din, N)
    call = MambaMixerStep(x=x, w_in=in_proj[0], sc_in=in_proj[1], b_in=in_proj[2], st=conv_state,
                          ss=conv_state.stride(0), conv_w=conv_w, conv_b=conv_b, w_x=x_proj[0], sc_x=x_proj[1],
                          b_x=x_proj[2], dt_w=dt_w, dt_b=dt_b, A=A, D=D, w_out=out_proj[0], sc_out=out_proj[1],
                          b_out=out_proj[2], s=state, work=work, xq=xq, new_st=new_conv, s_out=new_state, out=out,
                          Bt=Bt, d=d, Din=Din, N=N, R=R, K=K)
    _run_team(call, par, threads)
    return out, new_conv, new_state


def mamba_model_step(h: Tensor, layers: list[tuple], final_w: Optional[Tensor], head: Projection, eps: float,
                     sizes: tuple[int, int, int, int, int]) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
    """Logits [Bt, V] and each layer's (new conv window, new scan state) of a Mamba language model's step, after its
    embeddings h [Bt, d] (changed in place: the residual stream): ``layers`` holds, per layer, (norm weight, x-less
    arguments of :func:`mamba_mixer_step_takes`) = (norm_w, in_proj, conv_state, conv_w, conv_b, x_proj, dt_w, dt_b,
    A, D, out_proj, state), each of which that function takes with x = h; the norms' eps and the head as a
    projection (weight, int8 scales or None, no bias); sizes (d, Din, N, R, K). One call for the whole step."""
    Bt, (d, Din, N, R, K), V = h.shape[0], sizes, head[0].shape[0]
    L = len(layers)
    outs = [(torch.empty(Bt, K - 1, Din), torch.empty(Bt, Din, N)) for _ in range(L)]
    rows = []
    for (norm_w, inp, st, cw, cb, xp, dtw, dtb, A, D, outp, s), (new_st, s_out) in zip(layers, outs):
        tensors = (norm_w, inp[0], inp[1], inp[2], cw, cb, xp[0], xp[1], xp[2], dtw, dtb, A, D, outp[0], outp[1],
                   outp[2], st)
        rows.append([0 if t is None else t.data_ptr() for t in tensors]
                    + [st.stride(0), s.data_ptr(), new_st.data_ptr(), s_out.data_ptr()])
    tab = torch.tensor(rows, dtype=torch.int64).reshape(L, len(STEP_FIELDS))
    par, threads = _team(MambaModelStep)
    work = torch.empty(Bt * (2 * d + 4 * Din + R + 2 * N))
    xq = _int8_scratch(threads, Bt * max(d, Din), [head] + [p for layer in layers for p in (layer[1], layer[5],
                                                                                              layer[10])])
    logits = torch.empty(Bt, V)
    call = MambaModelStep(h=h, tab=tab, L=L, final_w=final_w, w_head=head[0], sc_head=head[1], work=work, xq=xq,
                          logits=logits, Bt=Bt, d=d, Din=Din, N=N, R=R, K=K, V=V, eps=float(eps))
    _run_team(call, par, threads)
    return logits, outs


def _team(entry: type[EntryPoint]):
    """(NAME_par or None, threads) for an entry point of one item whose stages the C code splits over the OpenMP
    team itself: the team is torch's thread count where the library has OpenMP, else one thread."""
    threads = torch.get_num_threads()
    par = kernel_library.function(entry, torch.float32, parallel=True) \
        if threads > 1 and kernel_threads.openmp_pool() else None
    return par, (threads if par is not None else 1)


def _int8_scratch(threads: int, size: int, projections) -> Tensor:
    """Each thread's row of int8 scratch for quantising a product's input: ``size`` values where any of the
    projections has int8 weights (scales given), else a placeholder."""
    int8 = any(p[1] is not None for p in projections)
    return torch.empty(threads, size if int8 else 1, dtype=torch.int8)


def _run_team(call: EntryPoint, par, threads: int) -> None:
    """Run a one-item entry point: NAME_par over the team, or NAME on this thread."""
    if par is not None:
        par(*call.par_args(), 1, threads)
    else:
        kernel_library.function(type(call), torch.float32)(*call.c_args(), 0, 1)


def projection_takes(p: Projection, rows: int, cols: int) -> bool:
    """Whether the fused steps read a projection (weight, scales, bias) of [rows, cols]: a float32 weight without
    scales or a contiguous int8 one with float32 scales [rows] and at most Q8_MAX_K columns; a float32 bias [rows]
    or None."""
    w, sc, b = p
    if sc is None:
        return w.dtype == torch.float32 and _plain(w, b) and _matrix(w, rows, cols) and _vector(b, rows)
    return (w.dtype == torch.int8 and w.is_cpu and cols <= Q8_MAX_K and _matrix(w, rows, cols) and _plain(sc, b)
            and _vector(sc, rows) and _vector(b, rows))


def _matrix(w: Tensor, rows: int, cols: int) -> bool:
    return w.shape == (rows, cols) and w.is_contiguous()
