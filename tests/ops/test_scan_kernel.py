"""The compiled selective-scan kernel (linlm.ops.scan_kernel, through selective_scan_kernel) against the
sequential reference, in float64, float32 and bfloat16, and the dispatch between it and the chunked form."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import BF16, BF16_ROUNDING, assert_rounded_once, bf16_and_f32_kernels, bf16_cotangent, needs_kernel
from test_selective_scan import (
    F64,
    assert_close_all,
    make_inputs,
    packed_and_separate,
    run_with_grads,
)

import linlm.ops.selective_scan as ss
from linlm.errors import ConfigError, ShapeError
from linlm.ops import kernel_library, scan_kernel
from linlm.ops.selective_scan import (
    selective_scan,
    selective_scan_chunked,
    selective_scan_kernel,
    selective_scan_reference,
)


@needs_kernel
@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
@pytest.mark.parametrize("batched", [False, True])
def test_kernel_matches_reference_float64(T, batched):
    """Lengths around the 64-step checkpoint interval; Din = 70 spans two channel tiles of 64 (one partial)."""
    x = make_inputs(Bt=2, T=T, Din=70, N=3, seed=T, batched=batched, D="batch" if batched else "vec")
    want = run_with_grads(selective_scan_reference, x)
    got = run_with_grads(selective_scan_kernel, x)
    assert_close_all(got, want, rtol=1e-9, atol=1e-10)


@needs_kernel
def test_kernel_without_initial_state_or_D():
    x = make_inputs(T=45, D="none", init=False, seed=3)
    assert_close_all(run_with_grads(selective_scan_kernel, x), run_with_grads(selective_scan_reference, x),
                     rtol=1e-9, atol=1e-10)


@needs_kernel
@pytest.mark.parametrize("dt_scale", [1.0, 200.0])
def test_kernel_float32_against_float64(dt_scale):
    """Float32 at a realistic size against the float64 definition; dt_scale 200 drives dt * A to -400 per step,
    where the kernel's exp must give 0, not NaN or inf."""
    x64 = make_inputs(Bt=2, T=150, Din=24, N=16, seed=5)
    x64["dt"] = x64["dt"] * dt_scale
    want = run_with_grads(selective_scan_reference, x64)
    x32 = {k: (v.float() if v is not None else None) for k, v in x64.items()}
    got = run_with_grads(selective_scan_kernel, x32)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    assert_close_all(got, want, rtol=1e-4, atol=1e-4)


@needs_kernel
def test_float32_decay_is_exp_to_one_rounding():
    """The kernel's own exp (range reduction and a polynomial): one step from a state of ones with u = 0 leaves
    exp(dt A) in the state, and in float32 it must be within one unit of float32's precision (eps, 1.2e-7) of exp of
    the same float32 product dt * A, for every product in [-87, 0] (below, float32 has no normal numbers). A
    polynomial one degree short misses (Taylor's degree 6: 1.8 eps; a degree-5 fit: 1.4 eps)."""
    Din, N = 4096, 16
    g = torch.Generator().manual_seed(0)
    A = -torch.rand(Din, N, generator=g, dtype=torch.float64).mul(87.0).float()
    A[0] = -torch.logspace(-8, 0, N, dtype=torch.float64).float()  # products near 0, where exp(r) ~ 1 + r
    dt = torch.ones(1, 1, Din)
    dt[0, 0, 1:8] = torch.tensor([0.0, 1e-3, 0.25, 0.5, 0.75, 0.999, 1.0])  # spread the products over a range
    zeros = torch.zeros(1, 1, N)
    _, final = selective_scan_kernel(torch.zeros(1, 1, Din), dt, A, zeros, zeros, None,
                                     initial_state=torch.ones(1, Din, N), output_final_state=True)
    x = (dt[0, 0, :, None] * A).double()  # the product as the kernel forms it, in float32
    want = torch.exp(x)
    rel = ((final[0].double() - want) / want).abs()
    worst = rel.max().item()
    assert worst <= torch.finfo(torch.float32).eps, f"worst {worst:.3g} at dt A = {x.flatten()[rel.argmax()]:.4g}"
    assert torch.equal(final[0, 1], torch.ones(N))  # dt = 0: exp(0) is exactly 1


@needs_kernel
def test_kernel_packed_documents_and_reset_gradients():
    y, ys, g = packed_and_separate(selective_scan_kernel, [[20, 1, 49, 30], [63, 37]], seed=8)
    torch.testing.assert_close(y, ys, rtol=1e-10, atol=1e-10)
    assert torch.equal(g["initial_state"], torch.zeros_like(g["initial_state"]))
    x = make_inputs(Bt=2, T=140, seed=9)
    reset = torch.rand(2, 140, generator=torch.Generator().manual_seed(10)) < 0.05
    reset[0, 64] = reset[1, 65] = True  # on and just after a checkpoint
    assert_close_all(run_with_grads(selective_scan_kernel, x, reset=reset),
                     run_with_grads(selective_scan_reference, x, reset=reset), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("backend", ["kernel", "torch"])
def test_lengths_equal_the_reference_on_each_prefix(backend, monkeypatch):
    """Rows that end early (MossNet's padded expert rows): the kernel skips the padding, the torch fallback of
    selective_scan masks it; both equal the reference run on each row's prefix, with y = D u on the padding and no
    gradient to dt, B, C there."""
    if backend == "kernel" and not kernel_library.available():
        pytest.skip("no C compiler")
    monkeypatch.setenv("LINLM_SCAN_BACKEND", backend)
    x = make_inputs(Bt=3, T=150, Din=70, N=5, seed=21, batched=True, D="batch")
    lengths = torch.tensor([150, 0, 77])
    y, s, g = run_with_grads(selective_scan, x, lengths=lengths, chunk_size=16)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=F64)  # as run_with_grads draws
    for b, n in enumerate(lengths.tolist()):
        row = {k: (v[b:b + 1, :n] if k in ("u", "dt", "B", "C") else v[b:b + 1]) for k, v in x.items()}
        if n:
            y_b, s_b = selective_scan_reference(**row)
            torch.testing.assert_close(y[b:b + 1, :n], y_b, rtol=1e-9, atol=1e-10)
            torch.testing.assert_close(s[b:b + 1], s_b, rtol=1e-9, atol=1e-10)
        else:
            torch.testing.assert_close(s[b], x["initial_state"][b], rtol=0, atol=0)
        torch.testing.assert_close(y[b, n:], x["D"][b] * x["u"][b, n:], rtol=1e-12, atol=1e-12)
        for name in ("dt", "B", "C"):
            assert torch.equal(g[name][b, n:], torch.zeros_like(g[name][b, n:])), name
        torch.testing.assert_close(g["u"][b, n:], gy[b, n:] * x["D"][b], rtol=1e-12, atol=1e-12)
    # the prefix gradients equal the reference's, for the loss <gy, y> alone
    full = {k: v.clone().requires_grad_(True) for k, v in x.items()}
    (selective_scan(**full, lengths=lengths, chunk_size=16)[0] * gy).sum().backward()
    b, n = 2, 77
    row = {k: (v[b:b + 1, :n] if k in ("u", "dt", "B", "C") else v[b:b + 1]) for k, v in x.items()}
    leaves = {k: v.clone().requires_grad_(True) for k, v in row.items()}
    (selective_scan_reference(**leaves)[0] * gy[b:b + 1, :n]).sum().backward()
    for name in ("u", "dt", "B", "C"):
        torch.testing.assert_close(full[name].grad[b:b + 1, :n], leaves[name].grad, rtol=1e-9, atol=1e-10)
    for name in ("A", "initial_state"):
        torch.testing.assert_close(full[name].grad[b:b + 1], leaves[name].grad, rtol=1e-9, atol=1e-10)
    pad_term = (gy[b, n:] * x["u"][b, n:]).sum(0)  # y = D u on the padding
    torch.testing.assert_close(full["D"].grad[b], leaves["D"].grad[0] + pad_term, rtol=1e-9, atol=1e-10)

@needs_kernel
def test_dispatcher_uses_the_kernel_and_the_env_switch(monkeypatch):
    x = make_inputs(T=40, seed=30)
    calls = []
    real = scan_kernel.kernel_scan
    monkeypatch.setattr(scan_kernel, "kernel_scan", lambda *a, **k: calls.append(1) or real(*a, **k))
    y, _ = selective_scan(**x)
    assert calls == [1]
    monkeypatch.setenv("LINLM_SCAN_BACKEND", "torch")
    y2, _ = selective_scan(**x)
    assert calls == [1]  # the chunked form ran
    torch.testing.assert_close(y2, y, rtol=1e-9, atol=1e-10)
    with pytest.raises(ConfigError, match="selective_scan_chunked"):
        selective_scan_kernel(**x)
    monkeypatch.setenv("LINLM_SCAN_BACKEND", "fastest")
    with pytest.raises(ConfigError, match="LINLM_SCAN_BACKEND"):
        selective_scan(**x)

@needs_kernel
def test_kernel_bad_inputs():
    x = make_inputs(Bt=2, T=7, Din=5, N=3)
    with pytest.raises(ShapeError, match="`lengths`"):
        selective_scan_kernel(**x, lengths=torch.tensor([1.0, 2.0]))
    with pytest.raises(ShapeError, match="`dt`"):
        selective_scan_kernel(**{**x, "dt": -x["dt"]})
    assert ss.selective_scan_kernel is selective_scan_kernel

@pytest.mark.parametrize("backend", ["kernel", "torch"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dt_softplus_equals_softplus_first(backend, dtype, monkeypatch):
    """dt_softplus=True (the kernel applies softplus to the pre-activation inside the scan, forward and backward)
    equals the reference run on softplus(dt), gradients included (dt's is the pre-activation's), also with rows
    ending early and pre-activations from -30 to 30 (both tails of softplus)."""
    if backend == "kernel" and not kernel_library.available():
        pytest.skip("no C compiler")
    monkeypatch.setenv("LINLM_SCAN_BACKEND", backend)
    x = make_inputs(Bt=3, T=90, Din=70, N=5, seed=31, batched=True, D="batch")
    g = torch.Generator().manual_seed(32)
    x["dt"] = torch.randn(x["dt"].shape, generator=g, dtype=F64) * 2.0 - 1.0
    x["dt"][0, :5] = torch.linspace(-30.0, 30.0, 5, dtype=F64)[:, None]
    x = {k: (v.to(dtype) if v is not None else None) for k, v in x.items()}
    x64 = {k: (v.double() if v is not None else None) for k, v in x.items()}
    lengths = torch.tensor([90, 0, 41])

    def softplus_first(u, dt, *a, **kw):
        return selective_scan(u, torch.nn.functional.softplus(dt), *a, **kw)

    want = run_with_grads(softplus_first, x64, lengths=lengths, chunk_size=16)
    got = run_with_grads(selective_scan, x, lengths=lengths, chunk_size=16, dt_softplus=True)
    tol = dict(rtol=1e-9, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-4, atol=2e-4)
    assert_close_all(got, want, **tol)
    # the reference and chunked forms take the flag too
    for fn in (selective_scan_reference, selective_scan_chunked):
        assert_close_all(run_with_grads(fn, x64, dt_softplus=True), run_with_grads(
            lambda u, dt, *a, **kw: fn(u, torch.nn.functional.softplus(dt), *a, **kw), x64), rtol=1e-10, atol=1e-12)

# ---------------------------------------------------------------------------------------------------------------------
# bfloat16 u: the kernel's _bf16 variant reads and writes it in place, computing in float32


def _scan_bf16_inputs(seed, **kw):
    """make_inputs with u held in bfloat16 and the rest in float32 (both exactly representable in float64)."""
    x = make_inputs(seed=seed, **kw)
    return {k: (None if v is None else v.to(BF16 if k == "u" else torch.float32)) for k, v in x.items()}


def _scan_grads(fn, x, gy, gs, **kw):
    """y, final state and every gradient of <y, gy> + <state, gs>; the cotangents hold bfloat16 values."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in x.items() if v is not None}
    args = {k: leaves.get(k) for k in x}
    y, s = fn(args["u"], args["dt"], args["A"], args["B"], args["C"], args["D"],
              initial_state=args["initial_state"], **kw)
    loss = (y.double() * gy.double()).sum() + (s.double() * gs.double()).sum()
    return y.detach(), s.detach(), dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))

@needs_kernel
@pytest.mark.parametrize("T", [1, 63, 100])
def test_bfloat16_scan_against_the_float64_reference(T):
    """bfloat16 u (and output gradient): y and du come back in bfloat16, the reference's values rounded once (to
    bfloat16's rounding, on top of float32's error as in the float32 test); the state and the float32 gradients
    (dt, A, B, C, D, the initial state) keep float32 accuracy, as their inputs are the same values. Documents,
    batched A and D, an initial state; the outputs are NaN-poisoned (conftest), so all must be written."""
    x = _scan_bf16_inputs(T, Bt=2, T=T, Din=70, N=16, batched=True, D="batch")
    reset = torch.rand(2, T, generator=torch.Generator().manual_seed(T)) < 0.05
    gy, gs = bf16_cotangent((2, T, 70), 1), bf16_cotangent((2, 70, 16), 2)
    y, s, g = _scan_grads(selective_scan_kernel, x, gy, gs, reset=reset, dt_softplus=True)
    assert y.dtype == BF16 and g["u"].dtype == BF16 and s.dtype == torch.float32 and g["dt"].dtype == torch.float32
    x64 = {k: (None if v is None else v.double()) for k, v in x.items()}
    y_ref, s_ref, g_ref = _scan_grads(selective_scan_reference, x64, gy, gs, reset=reset, dt_softplus=True)
    f32 = dict(rtol=1e-4, atol=1e-4)
    bf16 = dict(rtol=BF16_ROUNDING + f32["rtol"], atol=f32["atol"])
    for name, a, b, tol in [("y", y, y_ref, bf16), ("state", s, s_ref, f32)] + [
            (f"grad {k}", g[k], g_ref[k], bf16 if k == "u" else f32) for k in g_ref]:
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, **tol, msg=lambda m: f"{name}: {m}")

@needs_kernel
def test_bfloat16_scan_equals_the_float32_kernel_rounded():
    """With rows ending early (lengths, MossNet's padded rows: y = D u and du = D dy on the padding) and documents:
    y and du equal the float32 kernel's on the widened inputs, rounded once; every other output is the float32
    kernel's."""
    x = _scan_bf16_inputs(7, Bt=3, T=150, Din=70, N=5, batched=True, D="batch")
    reset = torch.zeros(3, 150, dtype=torch.bool)
    reset[0, 64] = reset[2, 20] = True
    lengths = torch.tensor([150, 0, 77])
    gy, gs = bf16_cotangent((3, 150, 70), 3), bf16_cotangent((3, 70, 5), 4)
    got, want = bf16_and_f32_kernels(lambda dt: _scan_grads(
        selective_scan_kernel, {k: (v.to(dt) if k == "u" else v) for k, v in x.items()}, gy, gs, reset=reset,
        lengths=lengths, dt_softplus=True))
    assert_rounded_once(got[0], want[0], "y")
    assert_rounded_once(got[2]["u"], want[2]["u"], "grad u")
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-6)
    for k in ("dt", "A", "B", "C", "D", "initial_state"):
        torch.testing.assert_close(got[2][k], want[2][k], rtol=1e-6, atol=1e-6, msg=lambda m: f"grad {k}: {m}")
