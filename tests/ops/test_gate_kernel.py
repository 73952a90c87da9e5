"""The compiled gated SiLU (linlm.ops.gate_kernel: Mamba's output gate and SwiGLU's activation) against torch's
ops, in float64, float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import BF16, BF16_ROUNDING, F64, assert_rounded_once, bf16_and_f32_kernels, bf16_cotangent
from kernel_checks import leaf, needs_kernel

from linlm.ops import gate_kernel


@needs_kernel
@pytest.mark.parametrize("M", [1, 15, 16, 37])
def test_gate_kernel_matches_torch(M):
    """silu(z) * y through the kernel, with z one half of a packed projection (strided rows) as in Mamba, against
    torch's ops: values and both gradients in float64 (to rounding), also in the saturated tails (|z| up to 120),
    and the rows split in blocks of 16 over threads (M around the block size)."""
    from linlm.layers.mamba import output_gate

    torch.manual_seed(M)
    packed = torch.randn(M, 2, 2, 70, dtype=F64) * 4.0
    packed[0, 1, 0, :5] = torch.tensor([-120.0, -40.0, 0.0, 40.0, 120.0], dtype=F64)
    y = torch.randn(M, 2, 70, dtype=F64)
    g = torch.randn(M, 2, 70, dtype=F64)
    results = []
    for fn in (output_gate, lambda y, z: y * torch.nn.functional.silu(z)):
        p, yl = packed.clone().requires_grad_(True), y.clone().requires_grad_(True)
        out = fn(yl, p[:, :, 1])
        (out * g).sum().backward()
        results.append((out, p.grad, yl.grad))
        if len(results) == 1:
            assert type(out.grad_fn).__name__ == "_SiluMulBackward"
    for a, b in zip(*results):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@needs_kernel
def test_float32_sigmoid_is_accurate_relative_to_its_value():
    """The kernels' sigmoid (the gate's, the conv's, softplus' derivative in the scan): silu(g) = g sigmoid(g) in
    float32 within 4 eps of float64's, relative to its value, for g in [-80, 80]; for negative g as 1 - 1 / (1 + e)
    it was off by 1e-3 at g = -10 and 20 % at g = -15 (cancellation)."""
    g = torch.linspace(-80.0, 80.0, 4001)
    got = gate_kernel.silu_mul(g, torch.ones_like(g)).double()
    g64 = g.double()
    want = g64 * torch.sigmoid(g64)
    rel = ((got - want) / want).abs()[want != 0]
    assert rel.max().item() <= 4 * torch.finfo(torch.float32).eps, f"worst at g = {g[want != 0][rel.argmax()]:.3f}"


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_glu_silu_kernel_matches_the_reference(dtype):
    """ops.fused.glu(h, "silu") on the CPU runs the gate kernel (gradient as one tensor of h's shape) and equals
    glu_reference: values and gradient, to rounding in float64 and float32; a float64 gradcheck."""
    from linlm.ops.fused import glu, glu_reference

    torch.manual_seed(3)
    h = (torch.randn(5, 33, 2 * 24, dtype=F64) * 3.0).to(dtype)
    g = torch.randn(5, 33, 24, dtype=F64).to(dtype)
    results = []
    for fn in (glu, glu_reference):
        hl = h.clone().requires_grad_(True)
        out = fn(hl, "silu")
        (out * g).sum().backward()
        results.append((out, hl.grad))
    assert type(results[0][0].grad_fn).__name__ == "_GluSiluBackward"
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == F64 else dict(rtol=1e-5, atol=1e-5)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **tol)
    with torch.no_grad():
        torch.testing.assert_close(glu(h, "silu"), results[1][0].detach(), **tol)
    if dtype == F64:
        assert torch.autograd.gradcheck(lambda x: glu(x, "silu"), (h[:2, :3].clone().requires_grad_(True),))


@needs_kernel
def test_gate_kernel_takes_only_one_float_dtype_on_the_cpu(monkeypatch):
    """float32, float64 and bfloat16 of one dtype run the kernel; mixed dtypes, float16 and shapes that would
    broadcast stay on torch's ops (the kernel takes equal shapes only), and LINLM_SCAN_BACKEND=torch turns the kernel
    off here as for the scan."""
    f32, f64 = torch.ones(2, 4), torch.ones(2, 4, dtype=F64)
    assert gate_kernel.gate_takes(f32, f32) and gate_kernel.gate_takes(f64)
    assert gate_kernel.gate_takes(f32.bfloat16(), f32.bfloat16())
    assert not gate_kernel.gate_takes(f32.half())
    assert not gate_kernel.gate_takes(f32.bfloat16(), f32)
    assert not gate_kernel.gate_takes(f32, f64)
    assert not gate_kernel.gate_takes(f32, torch.ones(1, 4))  # broadcasting stays on torch's ops
    monkeypatch.setenv("LINLM_SCAN_BACKEND", "torch")
    assert not gate_kernel.gate_takes(f32, f32)


@needs_kernel
def test_gate_kernel_without_grad_skips_the_autograd_functions(monkeypatch):
    """Where autograd records nothing (decoding), silu_mul and glu_silu run the kernel directly, with the values
    of the recorded path."""
    torch.manual_seed(9)
    z, y, h = (torch.randn(3, 1, n, requires_grad=True) for n in (40, 40, 80))
    want = (gate_kernel.silu_mul(z, y), gate_kernel.glu_silu(h))
    assert [type(w.grad_fn).__name__ for w in want] == ["_SiluMulBackward", "_GluSiluBackward"]
    for fn in (gate_kernel._SiluMul, gate_kernel._GluSilu):
        monkeypatch.setattr(fn, "apply", lambda *a: pytest.fail("autograd Function applied without grad"))
    with torch.no_grad():
        got = (gate_kernel.silu_mul(z, y), gate_kernel.glu_silu(h))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)

@needs_kernel
@pytest.mark.parametrize("M", [1, 37])
def test_bfloat16_gate_and_glu_against_float64_and_the_float32_kernel(M):
    """silu(g) * u (g one half of a packed projection, strided rows) and SwiGLU's glu on bfloat16: outputs and
    gradients are bfloat16, the float64 composite's values rounded once, where torch's bfloat16 ops round silu(g)
    first (two roundings); and they equal the float32 kernel's results rounded."""
    from linlm.ops.fused import glu

    gen = torch.Generator().manual_seed(M)
    packed = (torch.randn(M, 2, 70, generator=gen) * 4.0).to(BF16)
    y = torch.randn(M, 70, generator=gen).to(BF16)
    dout = bf16_cotangent((M, 70), 6)

    def run(dtype, fn=gate_kernel.silu_mul):
        p, yl = leaf(packed, dtype), leaf(y, dtype)
        out = fn(p[:, 1], yl)
        (out.double() * dout.double()).sum().backward()
        return [out.detach(), p.grad[:, 1], yl.grad]

    got, want = bf16_and_f32_kernels(run)
    exact = run(F64, lambda g, u: torch.nn.functional.silu(g) * u)
    for name, a, b, e in zip(["out", "dg", "du"], got, want, exact):
        assert_rounded_once(a, b, name)
        torch.testing.assert_close(a.double(), e, rtol=BF16_ROUNDING + 1e-6, atol=1e-6, msg=lambda m: f"{name}: {m}")
    h = leaf(packed.view(M, 140), BF16)
    out = glu(h, "silu")
    assert type(out.grad_fn).__name__ == "_GluSiluBackward" and out.dtype == BF16
    (out.double() * dout.double()).sum().backward()
    h64 = leaf(packed.view(M, 140), F64)
    ref = torch.nn.functional.silu(h64[:, :70]) * h64[:, 70:]
    (ref * dout.double()).sum().backward()
    tol = dict(rtol=BF16_ROUNDING + 1e-6, atol=1e-6)
    torch.testing.assert_close(out.double(), ref.detach(), **tol)
    torch.testing.assert_close(h.grad.double(), h64.grad, **tol)
