"""The gather-sum of rows behind the mixtures of experts' read-back, out[n] = sum_j w[n, j] src[idx[n, j]] with no
row of src read twice, on the compiled CPU kernel (``_gather_sum_kernel.c``, loaded by linlm.ops.kernel_library):
its two entry points, gather_sum_fwd and gather_sum_bwd, and the autograd Function around them. The op that calls
it, with its embedding_bag fallback, is linlm.ops.routing.read_back; benchmarks/bench_fused.py measures the two.

One pass each way: the backward reads each output gradient row and each slot's row once for both gradients, and
stores each row's gradient instead of adding to it (no row is read twice).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from linlm.ops import kernel_library, kernel_threads
from linlm.ops.grad import needs_grad
from linlm.ops.kernel_library import EntryPoint, entry_point

__all__ = ["GATHER_ROWS", "gather_sum_takes", "weighted_gather_sum"]

GATHER_ROWS = 32  # output rows per work item of the gather-sum; must equal GATHER_ROWS in the C source


@entry_point("gather_sum_fwd")
class GatherSumFwd(EntryPoint):
    """out [M, D] from src rows of D values, idx and w [M, m]."""

    src: Tensor
    idx: Tensor
    w: Tensor
    out: Tensor
    M: int
    m: int
    D: int


@entry_point("gather_sum_bwd")
class GatherSumBwd(EntryPoint):
    """dsrc (only the rows that idx lists are written) and dw from dout."""

    dout: Tensor
    src: Tensor
    idx: Tensor
    w: Tensor
    dsrc: Tensor
    dw: Tensor
    M: int
    m: int
    D: int


def gather_sum_takes(src: Tensor, weights: Tensor) -> bool:
    """Whether the gather-sum kernel runs for rows src [S, D] and their weights: on the CPU, src float32, float64 or
    bfloat16, the weights in its compute dtype (float32 for bfloat16 rows: the sums accumulate in float32, the
    weights' gradient too), and the kernel available (built)."""
    return (src.device.type == "cpu" and src.dtype in kernel_library.IO_DTYPES and src.dim() == 2
            and weights.device.type == "cpu" and weights.dtype == kernel_library.compute_dtype(src.dtype)
            and kernel_library.available())


def _gather_sum_forward(src: Tensor, idx: Tensor, w: Tensor) -> Tensor:
    M, m = idx.shape
    out = src.new_empty(M, src.shape[1])
    if M and m:
        call = GatherSumFwd(src=src, idx=idx, w=w, out=out, M=M, m=m, D=src.shape[1])
        kernel_threads.run(call, src.dtype, -(-M // GATHER_ROWS))
    elif M:
        out.zero_()
    return out


class _WeightedGatherSum(torch.autograd.Function):
    """out[n] = sum_j w[n, j] src[idx[n, j]], where no row of src is read twice (the backward stores each row's
    gradient instead of adding to it)."""

    @staticmethod
    def forward(ctx, src, idx, w):
        ctx.save_for_backward(src, idx, w)
        return _gather_sum_forward(src, idx, w)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        src, idx, w = ctx.saved_tensors
        M, m = idx.shape
        # Every row is written where the entries read as many rows as src has (all of them, none twice: the MLP's
        # combine); else the rows that no entry reads (the read-back's padding slots) start at zero.
        dsrc = torch.empty_like(src) if idx.numel() == src.shape[0] else torch.zeros_like(src)
        dw = torch.empty_like(w)
        if M and m:
            dout = dout.to(src.dtype).contiguous()
            call = GatherSumBwd(dout=dout, src=src, idx=idx, w=w, dsrc=dsrc, dw=dw, M=M, m=m, D=src.shape[1])
            kernel_threads.run(call, src.dtype, -(-M // GATHER_ROWS))
        return (dsrc if ctx.needs_input_grad[0] else None), None, (dw if ctx.needs_input_grad[2] else None)


def weighted_gather_sum(src: Tensor, idx: Tensor, weights: Tensor) -> Tensor:
    """out[n] = sum_j weights[n, j] src[idx[n, j]] for src [S, D], idx [N, m] and weights [N, m], differentiable in
    src and weights, where no row of src is read twice (each expert slot is one token's). For tensors that
    gather_sum_takes."""
    src, idx, w = src.contiguous(), idx.to(torch.int64).contiguous(), weights.contiguous()
    if not needs_grad(src, w):
        return _gather_sum_forward(src, idx, w)
    return _WeightedGatherSum.apply(src, idx, w)
