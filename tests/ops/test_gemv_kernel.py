"""The compiled matrix-vector products of a decoding step (linlm.ops.gemv_kernel): against float64 within the bound
of float32 summation, the same bits on any number of threads, and the calls it leaves to F.linear
(tests/layers/test_decode_linear.py checks the models' use of it)."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import needs_kernel

from linlm.ops import gemv_kernel, kernel_threads
from linlm.ops.gemv_kernel import GEMV_MAX_ROWS, small_linear, small_linear_takes

F32_EPS = 2.0**-24


@pytest.fixture
def any_size(monkeypatch):
    """The kernel takes weights of any size (by default small ones stay on F.linear, for speed only)."""
    monkeypatch.setattr(gemv_kernel, "GEMV_MIN_WEIGHTS", 0)


def operands(rows, n, k, bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen)
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    return x, w, b


def assert_within_summation_bound(got, x, w, b):
    """|got - exact| <= (k + 1) eps sum_k |x w| (+ |b|): the error bound of float32 dot products of length k, in
    any summation order, with the bias added once."""
    exact = x.double() @ w.double().T + (0 if b is None else b.double())
    magnitude = x.double().abs() @ w.double().abs().T + (0 if b is None else b.double().abs())
    bound = (x.shape[-1] + 1) * F32_EPS * magnitude + 1e-30
    err = (got.double() - exact).abs()
    assert (err <= bound).all(), f"worst error {(err / bound).max().item():.2f}x the summation bound"


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, GEMV_MAX_ROWS])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 5), (8, 64), (65, 129), (200, 33)])
@pytest.mark.parametrize("bias", [False, True])
def test_products_against_float64(rows, n, k, bias, any_size):
    """Row counts up to the limit; output sizes below, at and past the 8-row group and the 64-row work item, with
    a remainder; input sizes that are not a multiple of any vector width."""
    x, w, b = operands(rows, n, k, bias)
    with torch.no_grad():
        assert small_linear_takes(x, w, b)
        got = small_linear(x, w, b)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    assert_within_summation_bound(got, x, w, b)


@needs_kernel
def test_the_float64_variant_is_exact_to_float64_rounding():
    x, w, b = operands(4, 130, 77, True, seed=3)
    got = small_linear(x.double(), w.double(), b.double())
    torch.testing.assert_close(got, x.double() @ w.double().T + b.double(), rtol=1e-13, atol=1e-13)


@needs_kernel
def test_leading_dimensions_are_kept_and_threads_change_no_bit():
    """A [2, 1, k] decoding input comes back [2, 1, n]; each output is computed by one thread in one order, so two
    threads give the bits one thread gives."""
    x, w, b = operands(2, 300, 96, True, seed=5)
    x = x.view(2, 1, 96)
    was = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = small_linear(x, w, b)
        torch.set_num_threads(2)
        two = small_linear(x, w, b)
        with kernel_threads.own_threads():
            own = small_linear(x, w, b)
    finally:
        torch.set_num_threads(was)
    assert one.shape == (2, 1, 300)
    assert torch.equal(one, two) and torch.equal(one, own)
    assert_within_summation_bound(one.view(2, 300), x.view(2, 96), w, b)


@needs_kernel
def test_what_the_kernel_leaves_to_f_linear(any_size):
    x, w, b = operands(1, 16, 8, True)
    with torch.no_grad():
        assert small_linear_takes(x, w, b)
        assert not small_linear_takes(torch.randn(GEMV_MAX_ROWS + 1, 8), w, b)  # a prefill's rows
        assert not small_linear_takes(x.bfloat16(), w.bfloat16(), None)  # float32 only
        assert not small_linear_takes(x, w.T.contiguous().T, b)  # a transposed view of a weight
        assert not small_linear_takes(torch.randn(1, 9), w, b)  # the wrong width: F.linear's error
        assert not small_linear_takes(x[:0], w, b)
        assert not small_linear_takes(x, w, b[:-1])  # a bias of the wrong size: the kernel would read past it
        assert not small_linear_takes(x, w.to("meta"), None)  # no storage to read
        assert not small_linear_takes(x, w, b.to("meta"))
    assert not small_linear_takes(x, w.requires_grad_(), b)  # a gradient is wanted: autograd's F.linear
    with torch.no_grad():
        assert small_linear_takes(x, w, b)  # the same weight, no gradient wanted


@needs_kernel
def test_small_weights_stay_on_f_linear():
    x = torch.randn(1, 256)
    with torch.no_grad():
        assert small_linear_takes(x, torch.randn(256, 256), None)
        assert not small_linear_takes(x, torch.randn(255, 256), None)
