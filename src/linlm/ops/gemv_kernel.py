"""The matrix-vector products of a decoding step on the compiled CPU kernel (``_gemv_kernel.c``, loaded by
linlm.ops.kernel_library): y = x W^T (+ b) for inputs of at most ``GEMV_MAX_ROWS`` rows (the int8 kernel, for
linlm.models.quant: ``Q8_MAX_ROWS``), without autograd.

A batch-1 decoding step is bound by reading every weight once. torch computes a one-row ``F.linear`` as a general
matrix product, which reads the weights below the machine's streaming rate; the kernel reads each weight row once
for all the input's rows (in the weights' memory order for up to 4 input rows, eight weight rows side by side for
more), with a vectorised reduction over the input features (benchmarks/bench_gemv.py times it against ``F.linear``
on weights read from memory; benchmarks/bench_llamacpp.py times decoding with it and without it). Larger inputs (a
prefill, training) and anything needing gradients keep ``F.linear``.
"""

from __future__ import annotations

from ctypes import c_int
from typing import Optional

import torch
from torch import Tensor

from linlm.ops import kernel_library, kernel_threads
from linlm.ops.kernel_entries import GEMV_ROWS, Q8_MAX_K, Q8_MAX_ROWS, GemvQ8, GemvRows

__all__ = ["GEMV_MAX_ROWS", "Q8_MAX_K", "Q8_MAX_ROWS", "q8_form", "q8_linear", "q8_linear_takes", "small_linear",
           "small_linear_takes"]

GEMV_MAX_ROWS = 8  # inputs of more rows than this are a prefill's: torch's matrix product is the faster there
# Smaller weights stay on F.linear: a call through ctypes costs about 8 us more than F.linear's, which is more than
# the kernel saves below about 256 x 256 weights (1 thread, AMD EPYC, AVX2: 128 x 128 took 18.9 us against
# F.linear's 11.2, 256 x 256 16.5 against 19.3, 768 x 768 57.9 against 67.8).
GEMV_MIN_WEIGHTS = 1 << 16


def small_linear_takes(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> bool:
    """Whether the kernel computes F.linear(x, weight, bias): every tensor on the CPU (with storage: not meta) and
    float32, shapes F.linear accepts, no gradient wanted, at most GEMV_MAX_ROWS rows of x, a contiguous weight of
    at least GEMV_MIN_WEIGHTS values and a contiguous bias, not under torch.jit tracing, torch.compile or
    torch.export, and the kernel available (built). Anything else, malformed input included, goes to F.linear,
    which raises its own error. Called for every Linear of a decoding step: the cheap tests come first."""
    return (weight.numel() >= GEMV_MIN_WEIGHTS and 0 < x.numel() <= GEMV_MAX_ROWS * x.shape[-1]
            and x.dtype == torch.float32
            and weight.dtype == torch.float32 and x.is_cpu and weight.is_cpu and weight.dim() == 2
            and x.shape[-1] == weight.shape[1] and weight.is_contiguous()
            and (bias is None or (bias.dtype == torch.float32 and bias.is_cpu and bias.shape == weight.shape[:1]
                                  and bias.is_contiguous()))
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or (bias is not None and bias.requires_grad)))
            and not torch.jit.is_tracing() and kernel_library.available())


def small_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """F.linear(x, weight, bias) for inputs that small_linear_takes, on the kernel."""
    N, K = weight.shape
    if not x.is_contiguous():
        x = x.contiguous()
    R = x.numel() // K
    y = torch.empty((*x.shape[:-1], N), dtype=x.dtype)  # [R, N] in memory
    items = -(-N // GEMV_ROWS)
    if kernel_threads.workers(items) == 1:  # a decoding step on one thread: the call without its dataclass
        fn = kernel_library.function(GemvRows, x.dtype)
        fn(x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(), R, N, K, 0, items)
    else:
        kernel_threads.run(GemvRows(x=x, w=weight, b=bias, y=y, R=R, N=N, K=K), x.dtype, items)
    return y


# What gemv_q8_form() in _gemv_kernel.c returns, by index: the instructions of the int8 sums, chosen when the library
# is compiled for this CPU.
Q8_FORMS = ("portable C", "AVX2", "AVX-512 VNNI")


def q8_form() -> Optional[str]:
    """Which instructions the int8 kernel sums with in this process (one of ``Q8_FORMS``), or None when the C
    kernels are not available. Every form gives the same int32 sums: they are exact."""
    if not kernel_library.available():
        return None
    fn = kernel_library.library().cdll.gemv_q8_form
    fn.argtypes, fn.restype = [], c_int
    return Q8_FORMS[fn()]


def q8_linear_takes(x: Tensor, q: Tensor, s: Tensor, bias: Optional[Tensor]) -> bool:
    """Whether :func:`q8_linear` computes x (q s)^T (+ bias): x float32 on the CPU with at most Q8_MAX_ROWS rows
    of at most Q8_MAX_K features and no gradient wanted, q int8 [N, K] and s float32 [N] contiguous, bias float32
    [N] or None, not under torch.jit tracing, torch.compile or torch.export, the kernel available."""
    return (0 < x.numel() <= Q8_MAX_ROWS * x.shape[-1] and x.shape[-1] <= Q8_MAX_K and x.dtype == torch.float32
            and q.dtype == torch.int8 and s.dtype == torch.float32 and x.is_cpu and q.is_cpu and s.is_cpu
            and q.dim() == 2
            and x.shape[-1] == q.shape[1] and q.is_contiguous() and s.shape == q.shape[:1] and s.is_contiguous()
            and (bias is None or (bias.dtype == torch.float32 and bias.is_cpu and bias.shape == q.shape[:1]
                                  and bias.is_contiguous()))
            and not (torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)))
            and not torch.jit.is_tracing() and kernel_library.available())


def q8_linear(x: Tensor, q: Tensor, s: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """x W^T (+ bias) for W ~ q s[:, None] (int8 per row), for inputs that q8_linear_takes: each row of x quantised
    to int8 with a scale of its own (max |x| / 127), sums exact in int32, one float32 multiply by both scales."""
    N, K = q.shape
    if not x.is_contiguous():
        x = x.contiguous()
    R = x.numel() // K
    y = torch.empty((*x.shape[:-1], N), dtype=torch.float32)
    items = -(-N // GEMV_ROWS)
    threads = kernel_threads.workers(items)
    xq = torch.empty(threads, R * K, dtype=torch.int8)
    if threads == 1:
        fn = kernel_library.function(GemvQ8, torch.float32)
        fn(x.data_ptr(), q.data_ptr(), s.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
           xq.data_ptr(), R, N, K, 0, items)
    else:
        kernel_threads.run(GemvQ8(x=x, q=q, s=s, b=bias, y=y, xq=xq, R=R, N=N, K=K), torch.float32, items)
    return y
