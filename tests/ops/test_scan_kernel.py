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
    """bfloat16, mixed dtypes and shapes that would broadcast stay on torch's ops (the kernel computes in float32 /
    float64 on equal shapes only), and LINLM_SCAN_BACKEND=torch turns the kernel off here as for the scan."""
    f32, f64 = torch.ones(2, 4), torch.ones(2, 4, dtype=F64)
    assert scan_kernel.gate_takes(f32, f32) and scan_kernel.gate_takes(f64)
    assert not scan_kernel.gate_takes(f32.bfloat16())
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
