"""Shared by the tests of the compiled kernels: the skip mark for a missing compiler, and the checks of the
kernels' bfloat16 variants (which read and write bfloat16 activations in place, computing in float32)."""

from __future__ import annotations

import pytest
import torch

from linlm.ops import kernel_library

needs_kernel = pytest.mark.skipif(not kernel_library.available(), reason="no C compiler: the kernel is not built")

F64 = torch.float64
BF16 = torch.bfloat16
# bfloat16 keeps 8 significant bits: rounding a value to nearest moves it by at most 2^-8 of itself
BF16_ROUNDING = 2.0**-8


def leaf(t, dtype):
    return t.detach().to(dtype).clone().requires_grad_(True)


def bf16_cotangent(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(BF16)


def bf16_and_f32_kernels(make):
    """Every kernel on bfloat16 activations and on the same values in float32: make(dtype) returns its outputs."""
    return make(BF16), make(torch.float32)


def assert_rounded_once(got_bf16, want_f32, name):
    """The bfloat16 variant gives the float32 variant's result rounded to nearest: equal, or one unit of bfloat16's
    last place apart where the float32 results differ in their last bits (the variants' loops are vectorised
    differently), so within 2^-7 of it."""
    assert got_bf16.dtype == BF16, name
    assert torch.isfinite(got_bf16).all(), name
    torch.testing.assert_close(got_bf16.float(), want_f32.to(BF16).float(), rtol=2 * BF16_ROUNDING, atol=0,
                               msg=lambda m: f"{name}: {m}")
