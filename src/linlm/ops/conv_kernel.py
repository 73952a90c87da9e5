"""Mamba's short causal depthwise conv with the SiLU after it, on the compiled CPU kernel (``_conv_kernel.c``,
loaded by linlm.ops.kernel_library): its two entry points, conv_fwd and conv_bwd, and the autograd Function around
them. The layer that calls it, with its torch fallback, is linlm.layers.mamba.ShortConv.

The conv is a memory-bound pass that torch makes as several ops; the kernel makes one pass each way and saves only
its inputs (the backward recomputes the pre-activation). benchmarks/bench_fused.py measures it against torch's
conv1d + silu.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from linlm.ops import kernel_library, kernel_threads
from linlm.ops.kernel_entries import CONV_TB, ConvFwd
from linlm.ops.kernel_library import EntryPoint, entry_point

__all__ = ["CONV_TB", "conv_silu"]




@entry_point("conv_bwd", scratch="ring")
class ConvBwd(EntryPoint):
    """dx, dstate (None: not wanted) and one partial sum of dw [items, K, C] and dbias [items, C] per work item;
    ring: per thread, K x C elements."""

    dy: Tensor
    x: Tensor
    state: Tensor | None
    wt: Tensor
    bias: Tensor
    since: Tensor | None
    ring: Tensor
    dx: Tensor
    dstate: Tensor | None
    dw: Tensor
    dbias: Tensor
    Bt: int
    T: int
    C: int
    K: int
    xs: int


class _ConvSiLU(torch.autograd.Function):
    """silu(causal depthwise conv1d(x) + bias), the backward recomputing the pre-activation (nothing else saved)."""

    @staticmethod
    def forward(ctx, x, state, wt, bias, since):
        Bt, T, C = x.shape
        K = wt.shape[0]
        out = x.new_empty(Bt, T, C)
        call = ConvFwd(x=x, state=state, wt=wt, bias=bias, since=since, out=out, Bt=Bt, T=T, C=C, K=K,
                       xs=x.stride(1))
        kernel_threads.run(call, x.dtype, Bt * -(-T // CONV_TB))
        ctx.save_for_backward(x, state, wt, bias, since)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, state, wt, bias, since = ctx.saved_tensors
        Bt, T, C = x.shape
        K = wt.shape[0]
        n_items = Bt * -(-T // CONV_TB)
        dy = dy.to(x.dtype).contiguous()
        dx = x.new_empty(Bt, T, C)
        dstate = None if state is None or not ctx.needs_input_grad[1] else torch.empty_like(state)
        dw, dbias = wt.new_empty(n_items, K, C), wt.new_empty(n_items, C)
        ring = wt.new_empty(kernel_threads.workers(n_items), K * C)  # one per thread
        call = ConvBwd(dy=dy, x=x, state=state, wt=wt, bias=bias, since=since, ring=ring, dx=dx, dstate=dstate,
                       dw=dw, dbias=dbias, Bt=Bt, T=T, C=C, K=K, xs=x.stride(1))
        kernel_threads.run(call, x.dtype, n_items)
        return dx, dstate, dw.sum(0), dbias.sum(0), None


def conv_silu(x: Tensor, state: Tensor | None, weight: Tensor, bias: Tensor, since: Tensor | None) -> Tensor:
    """silu(out) for out[t] = bias + sum_j weight[:, j] * x[t - (K - 1 - j)] (nn.Conv1d's tap layout), reading the
    K - 1 inputs before x from state [Bt, K - 1, C] (None: zeros). since: None or int [Bt, T], steps since the latest
    document start; a tap further back than that is dropped. Computed in float32 (float64 for float64 x), returned in
    x's dtype; float32, float64 and bfloat16 x (and state) are read and written in place, any other dtype goes
    through float32. Arguments already checked (layers.mamba.ShortConv)."""
    io = x.dtype if x.dtype in kernel_library.IO_DTYPES else torch.float32
    cd = kernel_library.compute_dtype(io)
    xc = x.to(io)
    if xc.stride(2) != 1 or xc.stride(0) != xc.shape[1] * xc.stride(1):  # rows evenly spaced: read in place
        xc = xc.contiguous()
    st = None if state is None or state.shape[1] == 0 else state.to(io).contiguous()
    sc = None if since is None else since.to(torch.int64).contiguous()
    out = _ConvSiLU.apply(xc, st, weight.to(cd).t().contiguous(), bias.to(cd).contiguous(), sc)
    return out.to(x.dtype)
