"""The compiled matrix-vector products of a decoding step (linlm.ops.gemv_kernel): against float64 within the bound
of float32 summation, the same bits on any number of threads, and the calls it leaves to F.linear
(tests/layers/test_decode_linear.py checks the models' use of it)."""

from __future__ import annotations

import platform

import pytest
import torch
from kernel_checks import needs_kernel

from linlm.ops import gemv_kernel, kernel_library, kernel_threads
from linlm.ops.gemv_kernel import (GEMV_MAX_ROWS, Q8_MAX_K, Q8_MAX_ROWS, q8_linear, q8_linear_takes, small_linear,
                                   small_linear_takes)

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
@pytest.mark.parametrize("rows", [1, 3, 4, 5, GEMV_MAX_ROWS])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 5), (8, 64), (65, 129), (200, 33), (9, 200)])
@pytest.mark.parametrize("bias", [False, True])
def test_products_against_float64(rows, n, k, bias, any_size):
    """Row counts up to the limit, on both sides of the kernel's change of loop at 4; output sizes below, at and
    past the 8-row group and the 64-row work item, with a remainder; input sizes below, at and past the 64 partial
    sums and not a multiple of any vector width."""
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


def q8_operands(rows, n, k, bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen) * torch.rand(rows, 1, generator=gen) * 4  # rows of different ranges
    q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    s = torch.rand(n, generator=gen) / 100
    b = torch.randn(n, generator=gen) if bias else None
    return x, q, s, b


def quantise_rows_as_the_kernel(x):
    """(xq, xs, near): each row's scale max |x| / 127 and x / scale rounded half away from zero, in float64; near
    marks the values within 1e-5 of a rounding boundary, which float32 arithmetic may round either way."""
    xs = x.double().abs().amax(-1, keepdim=True) / 127
    v = torch.where(xs > 0, x.double() / xs, torch.zeros_like(xs))
    near = ((v.abs() - v.abs().floor()) - 0.5).abs() < 1e-5
    return torch.sign(v) * torch.floor(v.abs() + 0.5), xs, near


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1, Q8_MAX_ROWS])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 5), (8, 64), (65, 129), (200, 33)])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_products_against_float64(rows, n, k, bias):
    """The int32 sums are exact, so each output is the float64 value of s xs sum(q xq) (+ b) to a few float32
    roundings (and one step of xq where a value lies on a rounding boundary); and the product is within the
    rounding of x of x W^T."""
    x, q, s, b = q8_operands(rows, n, k, bias)
    with torch.no_grad():
        assert q8_linear_takes(x, q, s, b)
        got = q8_linear(x, q, s, b)
    xq, xs, near = quantise_rows_as_the_kernel(x)
    w = q.double() * s.double()[:, None]
    exact = (xq @ q.double().T) * xs * s.double() + (0 if b is None else b.double())
    scale = exact.abs() + (0 if b is None else b.double().abs())
    boundary = xs * (near.double() @ w.abs().T)  # one step of xq at each value on a boundary
    assert ((got.double() - exact).abs() <= 4 * F32_EPS * scale + boundary + 1e-30).all()
    true = x.double() @ w.T + (0 if b is None else b.double())
    bound = (xs / 2) * w.abs().sum(1)  # |x - xq xs| <= xs / 2 in each of the k terms
    assert ((got.double() - true).abs() <= bound * 1.001 + 1e-6).all()


@needs_kernel
def test_int8_rows_of_zeros_and_threads():
    """A row of zeros gives the bias; each row is quantised on its own, so a row's outputs do not depend on the
    other rows, and two threads give one thread's bits."""
    x, q, s, b = q8_operands(Q8_MAX_ROWS, 300, 96, True, seed=7)
    x[2] = 0
    was = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = q8_linear(x, q, s, b)
        alone = q8_linear(x[1:2], q, s, b)
        torch.set_num_threads(2)
        two = q8_linear(x, q, s, b)
        with kernel_threads.own_threads():
            own = q8_linear(x, q, s, b)
    finally:
        torch.set_num_threads(was)
    assert torch.equal(one[2], b)
    assert torch.equal(one[1:2], alone)
    assert torch.equal(one, two) and torch.equal(one, own)


@needs_kernel
def test_int8_sums_are_exact_up_to_the_widest_input_the_kernel_takes():
    """At Q8_MAX_K features every product at its largest (127 * 127, the sum just below 2^31) and, in a second row
    of the weight, products of alternating sign that cancel: the outputs are 127 K (one scale of 1/127) and exactly
    0, so no partial sum overflowed or lost a sign, whatever the kernel's internal form of the inputs (the AVX-512
    form offsets them by 128, where partial sums wrap modulo 2^32). One more feature goes to torch."""
    K = Q8_MAX_K - Q8_MAX_K % 2  # even: the alternating row cancels exactly
    q = torch.full((2, K), 127, dtype=torch.int8)
    q[1, 1::2] = -127
    x = torch.ones(3, K)
    x[1] = -1.0  # every product negative: -127 K
    x[2, : K // 2] = -1.0  # half of them negative: 0 against the first row
    s = torch.ones(2)
    with torch.no_grad():
        assert q8_linear_takes(x, q, s, None)
        got = q8_linear(x, q, s).double()
        assert not q8_linear_takes(torch.ones(1, Q8_MAX_K + 1), torch.ones(2, Q8_MAX_K + 1, dtype=torch.int8), s, None)
    expect = torch.tensor([[127.0 * K, 0.0], [-127.0 * K, 0.0], [0.0, 0.0]], dtype=torch.float64)
    assert ((got - expect).abs() <= 4 * F32_EPS * 127.0 * K).all(), got
    assert got[0, 1] == 0 and got[1, 1] == 0 and got[2, 0] == 0
    # more input rows than a decoding step's (up to Q8_MAX_ROWS in one call): the same sums, row by row
    with torch.no_grad():
        many = q8_linear(x.repeat(3, 1), q.repeat(3, 1), torch.ones(6)).double()
    assert torch.equal(many, got.repeat(3, 3))


@needs_kernel
def test_the_int8_sums_use_the_widest_instructions_this_cpu_has():
    """Built with -march=native, the int8 kernel sums with AVX-512 VNNI where the CPU has it (and AVX-512 BW),
    else with AVX2 where it has that, else in portable C."""
    lib = kernel_library.library()
    if "-march=native" not in lib.flags or platform.machine().lower() not in kernel_library.X86:
        pytest.skip("the kernels were not built for this x86 CPU's own instructions")
    flags = set(kernel_library._cpu_flags().split())
    expect = ("AVX-512 VNNI" if {"avx512_vnni", "avx512bw"} <= flags else "AVX2" if "avx2" in flags
              else "portable C")
    assert gemv_kernel.q8_form() == expect


@needs_kernel
def test_what_the_int8_kernel_leaves_to_torch():
    x, q, s, b = q8_operands(1, 16, 8, True)
    with torch.no_grad():
        assert q8_linear_takes(x, q, s, b)
        assert q8_linear_takes(torch.randn(Q8_MAX_ROWS, 8), q, s, b)
        assert not q8_linear_takes(torch.randn(Q8_MAX_ROWS + 1, 8), q, s, b)
        assert not q8_linear_takes(x.bfloat16(), q, s, b)
        assert not q8_linear_takes(x, q.float(), s, b)
        assert not q8_linear_takes(x, q, s.double(), b)
        assert not q8_linear_takes(x, q.T.contiguous().T, s, b)
        assert not q8_linear_takes(torch.randn(1, 9), q, s, b)
        assert not q8_linear_takes(x, q, s[:-1], b)
        assert not q8_linear_takes(x, q, s, b[:-1])
        assert not q8_linear_takes(x, q.to("meta"), s, b)
    assert not q8_linear_takes(x.requires_grad_(), q, s, b)
