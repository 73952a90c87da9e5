"""The gated SiLU silu(g) * u on the compiled CPU kernel (``_gate_kernel.c``, loaded by linlm.ops.kernel_library):
its two entry points, silu_mul_fwd and silu_mul_bwd, and the autograd Functions around them, for Mamba's output
gate (g = z: ``silu_mul``, called by linlm.layers.mamba.output_gate) and SwiGLU's activation (g and u the two
halves of one projection: ``glu_silu``, called by linlm.ops.fused.glu).

torch makes the gate as silu and mul forward and three more ops backward, saving silu(g) besides its inputs; the
kernel makes one pass each way and saves only its inputs (the backward recomputes the sigmoid).
benchmarks/bench_fused.py measures both uses against torch's ops.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from linlm.ops import kernel_library, kernel_threads
from linlm.ops.grad import needs_grad
from linlm.ops.kernel_entries import GATE_ROWS, SiluMulFwd
from linlm.ops.kernel_library import EntryPoint, entry_point

__all__ = ["GATE_ROWS", "gate_takes", "glu_silu", "silu_mul"]




@entry_point("silu_mul_bwd")
class SiluMulBwd(EntryPoint):
    """dg and du from dout (contiguous); every other buffer with its own row spacing."""

    dout: Tensor
    g: Tensor
    gs: int
    u: Tensor
    us: int
    dg: Tensor
    dgs: int
    du: Tensor
    dus: int
    M: int
    F: int


def gate_takes(*tensors: Tensor) -> bool:
    """Whether the gate kernel runs for these tensors: all on the CPU, of one shape (no broadcasting) and one dtype,
    float32, float64 or bfloat16 (read and written in place, computed in float32: one rounding per output, where
    torch's bfloat16 ops round silu(g) before the product), and the kernel available (built)."""
    first = tensors[0]
    return (first.dtype in kernel_library.IO_DTYPES
            and all(t.device.type == "cpu" and t.dtype == first.dtype and t.shape == first.shape for t in tensors)
            and kernel_library.available())


def _rows(t: Tensor) -> Tensor:
    """t as [M, F] with contiguous rows at an even spacing: a view where t's layout allows it, else a copy."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _gate_forward(g2: Tensor, u2: Tensor) -> Tensor:
    M, F = g2.shape
    out = g2.new_empty(M, F)
    call = SiluMulFwd(g=g2, gs=g2.stride(0), u=u2, us=u2.stride(0), out=out, M=M, F=F)
    kernel_threads.run(call, g2.dtype, -(-M // GATE_ROWS))
    return out


def _gate_backward(dout: Tensor, g2: Tensor, u2: Tensor, dg: Tensor, du: Tensor) -> None:
    M, F = g2.shape
    dout = dout.reshape(M, F).to(g2.dtype).contiguous()
    call = SiluMulBwd(dout=dout, g=g2, gs=g2.stride(0), u=u2, us=u2.stride(0), dg=dg, dgs=dg.stride(0), du=du,
                      dus=du.stride(0), M=M, F=F)
    kernel_threads.run(call, g2.dtype, -(-M // GATE_ROWS))


def _glu_forward(h2: Tensor) -> Tensor:
    """silu(gate) * up for h2 = [gate | up] as [M, 2F] rows."""
    F = h2.shape[1] // 2
    return _gate_forward(h2[:, :F], h2[:, F:])


class _SiluMul(torch.autograd.Function):
    """silu(g) * u for two tensors of one shape; saves the inputs only (the backward recomputes the sigmoid)."""

    @staticmethod
    def forward(ctx, g, u):
        g2, u2 = _rows(g), _rows(u)
        ctx.save_for_backward(g2, u2)
        ctx.shape = g.shape
        return _gate_forward(g2, u2).view(g.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        g2, u2 = ctx.saved_tensors
        dg, du = g2.new_empty(g2.shape), u2.new_empty(u2.shape)
        _gate_backward(dout, g2, u2, dg, du)
        return dg.view(ctx.shape), du.view(ctx.shape)


class _GluSilu(torch.autograd.Function):
    """silu(gate) * up for h = [gate | up] on the last dim; the gradient comes back as one tensor of h's shape."""

    @staticmethod
    def forward(ctx, h):
        h2 = _rows(h)
        ctx.save_for_backward(h2)
        ctx.shape = h.shape
        return _glu_forward(h2).view(*h.shape[:-1], h.shape[-1] // 2)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        (h2,) = ctx.saved_tensors
        F = h2.shape[1] // 2
        dh = h2.new_empty(h2.shape)
        _gate_backward(dout, h2[:, :F], h2[:, F:], dh[:, :F], dh[:, F:])
        return dh.view(ctx.shape)


def silu_mul(g: Tensor, u: Tensor) -> Tensor:
    """silu(g) * u (Mamba's output gate, g = z) through the kernel, for tensors that gate_takes."""
    if not needs_grad(g, u):
        return _gate_forward(_rows(g), _rows(u)).view(g.shape)
    return _SiluMul.apply(g, u)


def glu_silu(h: Tensor) -> Tensor:
    """SwiGLU's silu(gate) * up for h = [gate | up] on the last dim, through the kernel, for an h that gate_takes."""
    if not needs_grad(h):
        return _glu_forward(_rows(h)).view(*h.shape[:-1], h.shape[-1] // 2)
    return _GluSilu.apply(h)
