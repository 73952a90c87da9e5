"""The compiled selective-scan kernel (linlm.ops.scan_kernel) against the sequential reference, and its fallback."""

from __future__ import annotations

import contextlib

import pytest
import torch
from test_selective_scan import (
    F64,
    assert_close_all,
    make_inputs,
    packed_and_separate,
    run_with_grads,
)

import linlm.ops.selective_scan as ss
from linlm.errors import ConfigError, ShapeError
from linlm.ops import scan_kernel
from linlm.ops.selective_scan import (
    selective_scan,
    selective_scan_chunked,
    selective_scan_kernel,
    selective_scan_reference,
)

needs_kernel = pytest.mark.skipif(not scan_kernel.available(), reason="no C compiler: the kernel is not built")


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
    if backend == "kernel" and not scan_kernel.available():
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


def _all_kernels(x, gate_in):
    """The scan with its gradients, then the conv + SiLU, the gate and the gather-sum, forward and backward."""
    from linlm.layers.mamba import ShortConv

    out = run_with_grads(selective_scan_kernel, x)
    torch.manual_seed(3)
    conv = ShortConv(200, 4)
    xc = gate_in.clone().requires_grad_(True)
    y, _ = conv(xc, None, None, silu=True)
    g, u = gate_in.clone().requires_grad_(True), gate_in.flip(1).clone().requires_grad_(True)
    z = scan_kernel.silu_mul(g, u)
    (y.square().sum() + (z * y.detach()).sum()).backward()
    # the gather-sum of the experts' read-back: 150 tokens of two slots each over 300 rows (none read twice), five
    # of its 32-row items
    rows = gate_in[0].clone().requires_grad_(True)  # [300, 200]
    idx = torch.randperm(300, generator=torch.Generator().manual_seed(6)).view(150, 2)
    w = torch.rand(150, 2, generator=torch.Generator().manual_seed(7)).requires_grad_(True)
    r = scan_kernel.weighted_gather_sum(rows, idx, w)
    (r * gate_in[2, :150]).sum().backward()
    return out, [y, xc.grad, conv.weight.grad, conv.bias.grad, z, g.grad, u.grad, r, rows.grad, w.grad]


@needs_kernel
@pytest.mark.parametrize("runner", ["openmp", "python"])
def test_threads_do_not_change_the_result(runner):
    """The work items are split over threads, in torch's OpenMP pool where the library was built with OpenMP, else
    on Python threads; each item's arithmetic is the same, so the results are bitwise equal to one thread's."""
    x = {k: (v.float() if v is not None else None) for k, v in make_inputs(Bt=3, T=100, Din=200, N=8).items()}
    gate_in = torch.randn(3, 300, 200, generator=torch.Generator().manual_seed(5))
    pool = scan_kernel.openmp_pool()
    if runner == "openmp" and not pool:
        pytest.skip("the kernel was built without OpenMP (the compiler has no -fopenmp)")
    was = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _all_kernels(x, gate_in)
        torch.set_num_threads(3)
        with scan_kernel.own_threads() if runner == "python" else contextlib.nullcontext():
            assert scan_kernel.openmp_pool() == (runner == "openmp")
            three = _all_kernels(x, gate_in)
    finally:
        torch.set_num_threads(was)
    assert scan_kernel.openmp_pool() == pool  # own_threads() is undone on leaving the block
    assert_close_all(three[0], one[0], rtol=0, atol=0)
    for i, (a, b) in enumerate(zip(three[1], one[1])):
        assert torch.equal(a, b), f"conv / gate / gather-sum output {i}"


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


def test_no_compiler_falls_back_with_a_warning(monkeypatch, tmp_path):
    """A failing build warns once and leaves the pure-torch scan in charge; nothing half-written stays behind."""
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("LINLM_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("LINLM_SCAN_BACKEND", raising=False)
    scan_kernel._library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="pure-torch"):
            assert not scan_kernel.available()
        x = make_inputs(T=20, seed=31)
        y, _ = selective_scan(**x)
        torch.testing.assert_close(y, selective_scan_chunked(**x)[0], rtol=0, atol=0)
        assert list(tmp_path.iterdir()) == []
        monkeypatch.setenv("LINLM_SCAN_BACKEND", "kernel")
        with pytest.raises(ConfigError, match="could not be built"):
            selective_scan(**x)
    finally:
        scan_kernel._library.cache_clear()


@needs_kernel
def test_kernel_bad_inputs():
    x = make_inputs(Bt=2, T=7, Din=5, N=3)
    with pytest.raises(ShapeError, match="`lengths`"):
        selective_scan_kernel(**x, lengths=torch.tensor([1.0, 2.0]))
    with pytest.raises(ShapeError, match="`dt`"):
        selective_scan_kernel(**{**x, "dt": -x["dt"]})
    assert ss.selective_scan_kernel is selective_scan_kernel


@needs_kernel
@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("T", [1, 3, 50, 300])
def test_conv_silu_kernel_matches_the_torch_conv(K, T, monkeypatch):
    """ShortConv(silu=True) through the kernel against the torch taps + F.silu: outputs, new states and gradients
    of x, the state, the weights and the bias, with and without documents. T = 300 spans three blocks of 128 steps
    (the backward's halo across blocks); the work items are split over 3 threads."""
    from linlm.layers.mamba import ShortConv

    torch.manual_seed(40 + K + T)
    conv = ShortConv(70, K).double()
    x = torch.randn(2, T, 70, dtype=F64)
    state = torch.randn(2, K - 1, 70, dtype=F64)
    reset = torch.zeros(2, T, dtype=torch.bool)
    reset[0, T // 2] = True
    reset[1, 0] = True
    if T > 200:
        reset[1, 127:130] = True  # documents starting around a block boundary
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    for st, rs in [(None, None), (state, None), (state, reset)]:
        outs = []
        for backend in ("kernel", "torch"):
            monkeypatch.setenv("LINLM_SCAN_BACKEND", backend)
            conv.zero_grad()
            xl = x.clone().requires_grad_(True)
            sl = None if st is None else st.clone().requires_grad_(True)
            out, new_state = conv(xl, sl, rs, silu=True)
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
            (out * g).sum().backward()
            outs.append([out, new_state, xl.grad, None if sl is None else sl.grad, conv.weight.grad.clone(),
                         conv.bias.grad.clone()])
        for name, a, b in zip(["out", "state", "dx", "dstate", "dw", "dbias"], *outs):
            if a is None or b is None:  # no state, or an empty one (K = 1): no gradient either way
                assert (a if b is None else b) is None or (a if b is None else b).numel() == 0, name
                continue
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda m: f"{name}: {m}")


@needs_kernel
@pytest.mark.parametrize("T", [1, 37])
def test_conv_silu_kernel_reads_one_half_of_a_projection_in_place(T):
    """x given as the first half of a [Bt, T, 2C] tensor (as Mamba's in_proj output is split) is read in place,
    with the same outputs and gradients as a contiguous copy."""
    torch.manual_seed(7)
    w, bias = torch.randn(70, 4, dtype=F64), torch.randn(70, dtype=F64)
    state = torch.randn(2, 3, 70, dtype=F64)
    since = torch.tensor([[t for t in range(T)], [t % 5 for t in range(T)]])
    full = torch.randn(2, T, 140, dtype=F64)
    g = torch.randn(2, T, 70, dtype=F64)
    results = []
    for make in (lambda f: f.chunk(2, dim=-1)[0], lambda f: f[..., :70].contiguous()):
        f = full.clone().requires_grad_(True)
        x = make(f)
        assert x.is_contiguous() == (len(results) == 1)
        out = scan_kernel.conv_silu(x, state, w, bias, since)
        (out * g).sum().backward()
        results.append((out, f.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["kernel", "torch"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dt_softplus_equals_softplus_first(backend, dtype, monkeypatch):
    """dt_softplus=True (the kernel applies softplus to the pre-activation inside the scan, forward and backward)
    equals the reference run on softplus(dt), gradients included (dt's is the pre-activation's), also with rows
    ending early and pre-activations from -30 to 30 (both tails of softplus)."""
    if backend == "kernel" and not scan_kernel.available():
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
    got = scan_kernel.silu_mul(g, torch.ones_like(g)).double()
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
    assert scan_kernel.gate_takes(f32, f32) and scan_kernel.gate_takes(f64)
    assert scan_kernel.gate_takes(f32.bfloat16(), f32.bfloat16())
    assert not scan_kernel.gate_takes(f32.half())
    assert not scan_kernel.gate_takes(f32.bfloat16(), f32)
    assert not scan_kernel.gate_takes(f32, f64)
    assert not scan_kernel.gate_takes(f32, torch.ones(1, 4))  # broadcasting stays on torch's ops
    monkeypatch.setenv("LINLM_SCAN_BACKEND", "torch")
    assert not scan_kernel.gate_takes(f32, f32)


@needs_kernel
def test_gate_kernel_without_grad_skips_the_autograd_functions(monkeypatch):
    """Where autograd records nothing (decoding), silu_mul and glu_silu run the kernel directly, with the values
    of the recorded path."""
    torch.manual_seed(9)
    z, y, h = (torch.randn(3, 1, n, requires_grad=True) for n in (40, 40, 80))
    want = (scan_kernel.silu_mul(z, y), scan_kernel.glu_silu(h))
    assert [type(w.grad_fn).__name__ for w in want] == ["_SiluMulBackward", "_GluSiluBackward"]
    for fn in (scan_kernel._SiluMul, scan_kernel._GluSilu):
        monkeypatch.setattr(fn, "apply", lambda *a: pytest.fail("autograd Function applied without grad"))
    with torch.no_grad():
        got = (scan_kernel.silu_mul(z, y), scan_kernel.glu_silu(h))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------------
# bfloat16 activations: the kernels' _bf16 variants read and write them in place, computing in float32

BF16 = torch.bfloat16
# bfloat16 keeps 8 significant bits: rounding a value to nearest moves it by at most 2^-8 of itself
BF16_ROUNDING = 2.0**-8


def _leaf(t, dtype):
    return t.detach().to(dtype).clone().requires_grad_(True)


def _bf16_cotangent(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(BF16)


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
    gy, gs = _bf16_cotangent((2, T, 70), 1), _bf16_cotangent((2, 70, 16), 2)
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


def _bf16_and_f32_kernels(make):
    """Every kernel on bfloat16 activations and on the same values in float32: make(dtype) returns its outputs."""
    return make(BF16), make(torch.float32)


def _assert_rounded_once(got_bf16, want_f32, name):
    """The bfloat16 variant gives the float32 variant's result rounded to nearest: equal, or one unit of bfloat16's
    last place apart where the float32 results differ in their last bits (the variants' loops are vectorised
    differently), so within 2^-7 of it."""
    assert got_bf16.dtype == BF16, name
    assert torch.isfinite(got_bf16).all(), name
    torch.testing.assert_close(got_bf16.float(), want_f32.to(BF16).float(), rtol=2 * BF16_ROUNDING, atol=0,
                               msg=lambda m: f"{name}: {m}")


@needs_kernel
def test_bfloat16_scan_equals_the_float32_kernel_rounded():
    """With rows ending early (lengths, MossNet's padded rows: y = D u and du = D dy on the padding) and documents:
    y and du equal the float32 kernel's on the widened inputs, rounded once; every other output is the float32
    kernel's."""
    x = _scan_bf16_inputs(7, Bt=3, T=150, Din=70, N=5, batched=True, D="batch")
    reset = torch.zeros(3, 150, dtype=torch.bool)
    reset[0, 64] = reset[2, 20] = True
    lengths = torch.tensor([150, 0, 77])
    gy, gs = _bf16_cotangent((3, 150, 70), 3), _bf16_cotangent((3, 70, 5), 4)
    got, want = _bf16_and_f32_kernels(lambda dt: _scan_grads(
        selective_scan_kernel, {k: (v.to(dt) if k == "u" else v) for k, v in x.items()}, gy, gs, reset=reset,
        lengths=lengths, dt_softplus=True))
    _assert_rounded_once(got[0], want[0], "y")
    _assert_rounded_once(got[2]["u"], want[2]["u"], "grad u")
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-6)
    for k in ("dt", "A", "B", "C", "D", "initial_state"):
        torch.testing.assert_close(got[2][k], want[2][k], rtol=1e-6, atol=1e-6, msg=lambda m: f"grad {k}: {m}")


@needs_kernel
@pytest.mark.parametrize("T", [1, 50, 300])
def test_bfloat16_conv_silu_against_float64_and_the_float32_kernel(T):
    """The conv + SiLU on bfloat16 x and state (x one half of a projection, read in place; documents): the output
    and the gradients of x and of the state are bfloat16, the float64 conv's values rounded once; the weights' and
    bias' gradients (float32) are the float32 kernel's; and every bfloat16 output is the float32 kernel's rounded."""
    gen = torch.Generator().manual_seed(T)
    w, bias = torch.randn(70, 4, generator=gen), torch.randn(70, generator=gen)
    full = torch.randn(2, T, 140, generator=gen).to(BF16)
    state = torch.randn(2, 3, 70, generator=gen).to(BF16)
    since = torch.tensor([[t for t in range(T)], [t % 37 for t in range(T)]])
    dy = _bf16_cotangent((2, T, 70), 5)

    def run(dtype, fn=scan_kernel.conv_silu):
        leaves = [_leaf(t, dtype) for t in (full, state)] + [_leaf(t, scan_kernel.compute_dtype(dtype)) for t in (w, bias)]
        out = fn(leaves[0][..., :70], leaves[1], leaves[2], leaves[3], since)
        (out.double() * dy.double()).sum().backward()
        return [out.detach(), leaves[0].grad, leaves[1].grad, leaves[2].grad, leaves[3].grad]

    def float64_conv(x, st, wt, b, since):
        xs = torch.cat([st, x], dim=1)  # [Bt, K - 1 + T, C]
        out = b + sum(xs[:, j:j + x.shape[1]] * wt[:, j] * (since >= 3 - j)[..., None] for j in range(4))
        return torch.nn.functional.silu(out)

    got, want = _bf16_and_f32_kernels(run)
    exact = run(F64, float64_conv)
    for i, name in enumerate(["out", "dx", "dstate"]):
        _assert_rounded_once(got[i if i == 0 else i], want[i], name)
    tol = dict(rtol=BF16_ROUNDING + 1e-5, atol=1e-5)
    torch.testing.assert_close(got[0].double(), exact[0], **tol)
    torch.testing.assert_close(got[1][..., :70].double(), exact[1][..., :70], **tol)
    torch.testing.assert_close(got[2].double(), exact[2], **tol)
    for i, name in ((3, "dw"), (4, "dbias")):
        assert got[i].dtype == torch.float32
        torch.testing.assert_close(got[i], want[i], rtol=1e-6, atol=1e-6, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(got[i].double(), exact[i], rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")


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
    dout = _bf16_cotangent((M, 70), 6)

    def run(dtype, fn=scan_kernel.silu_mul):
        p, yl = _leaf(packed, dtype), _leaf(y, dtype)
        out = fn(p[:, 1], yl)
        (out.double() * dout.double()).sum().backward()
        return [out.detach(), p.grad[:, 1], yl.grad]

    got, want = _bf16_and_f32_kernels(run)
    exact = run(F64, lambda g, u: torch.nn.functional.silu(g) * u)
    for name, a, b, e in zip(["out", "dg", "du"], got, want, exact):
        _assert_rounded_once(a, b, name)
        torch.testing.assert_close(a.double(), e, rtol=BF16_ROUNDING + 1e-6, atol=1e-6, msg=lambda m: f"{name}: {m}")
    h = _leaf(packed.view(M, 140), BF16)
    out = glu(h, "silu")
    assert type(out.grad_fn).__name__ == "_GluSiluBackward" and out.dtype == BF16
    (out.double() * dout.double()).sum().backward()
    h64 = _leaf(packed.view(M, 140), F64)
    ref = torch.nn.functional.silu(h64[:, :70]) * h64[:, 70:]
    (ref * dout.double()).sum().backward()
    tol = dict(rtol=BF16_ROUNDING + 1e-6, atol=1e-6)
    torch.testing.assert_close(out.double(), ref.detach(), **tol)
    torch.testing.assert_close(h.grad.double(), h64.grad, **tol)


@needs_kernel
def test_bfloat16_gather_sum_against_float64_and_the_float32_kernel():
    """The read-back's gather-sum on bfloat16 rows with float32 weights: the output and the rows' gradient are
    bfloat16, the float64 sums rounded once (summed in float32, not in bfloat16), the padding rows' gradient zero;
    the weights' gradient is float32, the float32 kernel's. 70 tokens of 2 slots over 150 rows, 10 never read."""
    gen = torch.Generator().manual_seed(11)
    src = torch.randn(150, 40, generator=gen).to(BF16)
    idx = torch.randperm(150, generator=gen)[:140].view(70, 2)
    w = torch.rand(70, 2, generator=gen)
    dout = _bf16_cotangent((70, 40), 7)

    def run(dtype, fn=scan_kernel.weighted_gather_sum):
        s, wl = _leaf(src, dtype), _leaf(w, scan_kernel.compute_dtype(dtype))
        out = fn(s, idx, wl)
        (out.double() * dout.double()).sum().backward()
        return [out.detach(), s.grad, wl.grad]

    got, want = _bf16_and_f32_kernels(run)
    exact = run(F64, lambda s, i, v: (v[..., None] * s[i]).sum(1))
    for name, i in (("out", 0), ("dsrc", 1)):
        _assert_rounded_once(got[i], want[i], name)
        torch.testing.assert_close(got[i].double(), exact[i], rtol=BF16_ROUNDING + 1e-6, atol=1e-6)
    unread = torch.ones(150, dtype=torch.bool).index_fill_(0, idx.reshape(-1), False)
    assert torch.equal(got[1][unread], torch.zeros(10, 40, dtype=BF16))
    assert got[2].dtype == torch.float32
    torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[2].double(), exact[2], rtol=1e-5, atol=1e-5)
