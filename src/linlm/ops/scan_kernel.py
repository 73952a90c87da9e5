"""The S6 selective scan on the compiled CPU kernel (``_scan_kernel.c``, loaded by linlm.ops.kernel_library): its
two entry points, scan_fwd and scan_bwd, and the autograd Function around them. The checked public form is
linlm.ops.selective_scan.selective_scan_kernel.

Why a kernel: the scan is a few multiply-adds per state element and step, so any form built from tensor ops is
bound by its passes over a [Bt, T, Din, N] working set (the chunked form makes about a dozen). The kernel keeps a
tile of 64 channels' states (N x 64 values) in L1 and makes one pass over the inputs forward, and in the backward
one recomputation and one adjoint pass per segment of 64 steps, from states checkpointed every 64 steps in the
forward (Bt x T/64 x Din x N values, what the chunked form keeps too). A tile's consecutive steps are Din values
apart (a new page per step at Din = 1024, where the hardware prefetchers stop), so both passes prefetch the rows a
few steps ahead. See the C file's header for the layout. benchmarks/bench_scan.py measures the kernel against the
chunked form.

u and y (and du) are float32, float64 or bfloat16 (read and written in place, computed in float32); dt, A, B, C, D,
the states and their gradients are in the compute dtype (kernel_library.compute_dtype).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from linlm.ops import kernel_library, kernel_threads
from linlm.ops.kernel_entries import CKPT, MAX_STATE, TILE, ScanFwd, ScanInputs
from linlm.ops.kernel_library import entry_point

__all__ = ["CKPT", "MAX_STATE", "TILE", "kernel_scan"]


@entry_point("scan_bwd", scratch="work")
class ScanBwd(ScanInputs):
    """The backward from the checkpoints: every gradient, dA, dD per batch row and dB, dC per tile of channels
    (the caller sums them); work: per thread, (2 N + 2) K TILE elements."""

    ckpt: Tensor
    dy: Tensor
    dfinal: Tensor | None
    du: Tensor
    ddt: Tensor
    dA: Tensor
    dB: Tensor
    dC: Tensor
    dD: Tensor
    dinit: Tensor
    work: Tensor


def _bstride(t: Tensor | None, batched_dim: int) -> int:
    """Elements between batch rows: A batched is [Bt, Din, N] (dim 3), D batched is [Bt, Din] (dim 2); 0 when shared."""
    return t[0].numel() if t is not None and t.dim() == batched_dim else 0


class _KernelScan(torch.autograd.Function):
    """y (with the D skip) and the final state. Inputs contiguous on the CPU: u (so y and du) float32, float64 or
    bfloat16, everything else in its compute dtype (compute_dtype). With dt_sp, dt is the pre-activation and the
    kernel applies softplus (its gradient is then the pre-activation's)."""

    @staticmethod
    def forward(ctx, u, dt, A, B, C, D, init, reset, lengths, dt_sp):
        ctx.set_materialize_grads(False)
        Bt, T, Din = u.shape
        N = A.shape[-1]
        nseg = -(-T // CKPT)
        ckpt = dt.new_empty(Bt, nseg, Din, N) if any(ctx.needs_input_grad[:7]) else None
        y = u.new_empty(Bt, T, Din)
        final = dt.new_empty(Bt, Din, N)
        reset_b = None if reset is None else reset.contiguous().view(torch.uint8)
        call = ScanFwd(u=u, dt=dt, A=A, a_bstride=_bstride(A, 3), Bm=B, Cm=C, D=D, d_bstride=_bstride(D, 2),
                       init=init, reset=reset_b, lengths=lengths, y=y, final=final, ckpt=ckpt, dt_sp=int(dt_sp),
                       Bt=Bt, T=T, Din=Din, N=N, K=CKPT)
        kernel_threads.run(call, u.dtype, Bt * -(-Din // TILE))
        if ckpt is not None:
            ctx.save_for_backward(u, dt, A, B, C, D, reset_b, lengths, ckpt)
            ctx.dt_sp = bool(dt_sp)
        return y, final

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dfinal):
        u, dt, A, B, C, D, reset_b, lengths, ckpt = ctx.saved_tensors
        Bt, T, Din = u.shape
        N = A.shape[-1]
        ntiles = -(-Din // TILE)
        dy = u.new_zeros(Bt, T, Din) if dy is None else dy.to(u.dtype).contiguous()
        dfinal = None if dfinal is None else dfinal.to(dt.dtype).contiguous()
        du, ddt = torch.empty_like(u), torch.empty_like(dt)
        dA_rows, dD_rows = dt.new_empty(Bt, Din, N), dt.new_empty(Bt, Din)
        dB_parts, dC_parts = dt.new_empty(ntiles, Bt, T, N), dt.new_empty(ntiles, Bt, T, N)
        dinit = dt.new_empty(Bt, Din, N)
        n_items = Bt * ntiles
        work = dt.new_empty(kernel_threads.workers(n_items), (2 * N + 2) * CKPT * TILE)
        call = ScanBwd(u=u, dt=dt, A=A, a_bstride=_bstride(A, 3), Bm=B, Cm=C, D=D, d_bstride=_bstride(D, 2),
                       reset=reset_b, lengths=lengths, ckpt=ckpt, dy=dy, dfinal=dfinal, du=du, ddt=ddt, dA=dA_rows,
                       dB=dB_parts, dC=dC_parts, dD=dD_rows, dinit=dinit, work=work, dt_sp=int(ctx.dt_sp), Bt=Bt,
                       T=T, Din=Din, N=N, K=CKPT)
        kernel_threads.run(call, u.dtype, n_items)
        dA = dA_rows if A.dim() == 3 else dA_rows.sum(0)
        dD = None if D is None else (dD_rows if D.dim() == 2 else dD_rows.sum(0))
        dB = dB_parts[0] if ntiles == 1 else dB_parts.sum(0)
        dC = dC_parts[0] if ntiles == 1 else dC_parts.sum(0)
        grads = (du, ddt, dA, dB, dC, dD, dinit)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:7])), None, None, None)


def kernel_scan(u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, init: Tensor | None,
                reset: Tensor | None, lengths: Tensor | None = None,
                dt_softplus: bool = False) -> tuple[Tensor, Tensor]:
    """(y = scan + D u, final state). u and y in u's dtype (float32, float64 or bfloat16: the kernel reads and
    writes bfloat16 in place, computing in float32), the state and every other input in compute_dtype(u.dtype).
    Arguments already checked.

    dt_softplus: dt is the pre-activation and the step size is softplus(dt), computed in the kernel (no separate pass
    over dt, forward or backward).

    lengths: None or int64 [Bt]: row b is steps 0 .. lengths[b] - 1; later steps are padding, where y = D u, the state
    stays as it is and no gradient reaches dt, B, C (nor u beyond D's term).
    """
    cd = kernel_library.compute_dtype(u.dtype)
    u = u.contiguous()
    dt, A, B, C = (t.to(cd).contiguous() for t in (dt, A, B, C))
    D, init = (None if t is None else t.to(cd).contiguous() for t in (D, init))
    if lengths is not None:
        lengths = lengths.to(torch.int64).clamp(0, u.shape[1]).contiguous()
    return _KernelScan.apply(u, dt, A, B, C, D, init, reset, lengths, dt_softplus)
