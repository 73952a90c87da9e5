"""The compiled element-wise work of a decoding step (linlm.ops.step_kernel): the short conv's step, Mamba's scan
step and RMSNorm's rows, each against float64 within a float32 error bound, the same bits on 1 and 2 threads, the
calls they leave to torch, and a Mamba model's step through them against its step on torch's ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_checks import needs_kernel

import linlm
from linlm.layers.mamba import ShortConv
from linlm.models import lm as lm_module
from linlm.ops import step_kernel
from linlm.ops.fused import rms_norm
from linlm.ops.step_kernel import (RMS_MAX_ROWS, conv_step, conv_step_takes, mamba_step, mamba_step_takes,
                                   rms_rows, rms_rows_takes)

F32_EPS = 2.0**-24


def conv_operands(B, C, K, bias, seed=0):
    """x as the first half of a [B, 2C] projection (a row stride of 2C), the window as the tail of a longer one."""
    gen = torch.Generator().manual_seed(seed)
    xz = torch.randn(B, 2 * C, generator=gen)
    window = torch.randn(B, K + 1, C, generator=gen)
    w = torch.randn(C, K, generator=gen)
    b = torch.randn(C, generator=gen) if bias else None
    return xz[:, :C], window[:, 2:], w, b


@needs_kernel
@pytest.mark.parametrize("B,C,K", [(1, 5, 2), (3, 64, 4), (2, 130, 3), (1, 1536, 4)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("silu", [False, True])
def test_conv_step_against_float64(B, C, K, bias, silu):
    """out within (K + 4) eps of the taps' magnitude (the float32 sum of K products and a bias, then SiLU, whose
    slope is below 1.1); the new window is exactly the old one shifted by x; the given window is not changed."""
    x, st, w, b = conv_operands(B, C, K, bias)
    before = st.clone()
    with torch.no_grad():
        assert conv_step_takes(x, st, w, b)
        out, new = conv_step(x, st, w, b, silu)
    window = torch.cat([st, x[:, None]], 1).double()
    pre = (window * w.double().t()).sum(1) + (0 if b is None else b.double())
    exact = F.silu(pre) if silu else pre
    magnitude = (window.abs() * w.double().abs().t()).sum(1) + (0 if b is None else b.double().abs())
    bound = (K + 4) * F32_EPS * (magnitude + exact.abs()) + 1e-30
    err = (out.double() - exact).abs()
    assert (err <= bound).all(), f"worst error {(err / bound).max().item():.2f}x the bound"
    assert torch.equal(new, torch.cat([st[:, 1:], x[:, None]], 1))
    assert torch.equal(st, before)


@needs_kernel
def test_short_conv_step_takes_the_kernel_and_matches_its_torch_form(monkeypatch):
    conv = ShortConv(96, 4)
    x, st, _, _ = conv_operands(2, 96, 4, True, seed=1)
    with torch.no_grad():
        got = conv.step(x, st, silu=True)
        monkeypatch.setattr(step_kernel, "conv_step_takes", lambda *a: False)
        ref = conv.step(x, st, silu=True)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(got[1], ref[1])


def mamba_operands(B, Din, N, R, seed=0):
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(B, Din, generator=gen)
    xp = torch.randn(B, R + 2 * N, generator=gen)
    z = torch.randn(B, 2 * Din, generator=gen)[:, Din:]  # the second half of in_proj's output
    dt_w = torch.randn(Din, R, generator=gen) * R**-0.5
    dt_b = torch.randn(Din, generator=gen) - 3
    A = -torch.rand(Din, N, generator=gen) * N
    D = torch.randn(Din, generator=gen)
    s = torch.randn(B, Din, N, generator=gen)
    return u, xp, z, dt_w, dt_b, A, D, s


def mamba_reference(u, xp, z, dt_w, dt_b, A, D, s):
    """The step's definition in the inputs' dtype."""
    R, N = dt_w.shape[1], A.shape[1]
    dt_low, Bm, Cm = xp.split([R, N, N], -1)
    dt = F.softplus(dt_low @ dt_w.T + (0 if dt_b is None else dt_b))
    s2 = torch.exp(dt[..., None] * A) * s + (dt * u)[..., None] * Bm[:, None]
    y = (s2 * Cm[:, None]).sum(-1) + (0 if D is None else D * u)
    return (y if z is None else y * F.silu(z)), s2


@needs_kernel
@pytest.mark.parametrize("B,Din,N,R", [(1, 7, 1, 1), (2, 64, 16, 4), (3, 130, 5, 9), (1, 1536, 16, 48)])
@pytest.mark.parametrize("gate", [False, True])
def test_mamba_step_against_float64(B, Din, N, R, gate):
    """y and the new state against the float64 definition: no worse than torch's own float32 ops on the same
    inputs (3x their worst error, for a different summation order), and within 64 eps of the values' scale."""
    args = list(mamba_operands(B, Din, N, R))
    if not gate:
        args[2] = None
    before = args[-1].clone()
    with torch.no_grad():
        assert mamba_step_takes(*args)
        y, s2 = mamba_step(*args)
        ey, es = mamba_reference(*[None if a is None else a.double() for a in args])
        ty, ts = mamba_reference(*args)
    for got, torch32, exact in ((y, ty, ey), (s2, ts, es)):
        err = (got.double() - exact).abs().max().item()
        assert err <= 3 * (torch32.double() - exact).abs().max().item() + 1e-30
        assert err <= 64 * F32_EPS * exact.abs().max().item()
    assert torch.equal(args[-1], before)


@needs_kernel
@pytest.mark.parametrize("rows,F_", [(1, 1), (1, 768), (3, 130), (RMS_MAX_ROWS, 64)])
@pytest.mark.parametrize("weight", [False, True])
def test_rms_rows_against_float64(rows, F_, weight):
    gen = torch.Generator().manual_seed(rows * F_)
    x = torch.randn(rows, F_, generator=gen)
    w = torch.randn(F_, generator=gen) if weight else None
    with torch.no_grad():
        assert rms_rows_takes(x, w)
        got = rms_rows(x, w, 1e-6)
        exact = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
        if w is not None:
            exact = exact * w.double()
    err = (got.double() - exact).abs()
    assert (err <= (F_ + 8) * F32_EPS * exact.abs() + 1e-30).all()


@needs_kernel
def test_the_same_bits_on_one_and_two_threads():
    u, xp, z, dt_w, dt_b, A, D, s = mamba_operands(3, 1536, 16, 48, seed=4)
    x, st, w, b = conv_operands(3, 1536, 4, True, seed=4)
    rows = torch.randn(RMS_MAX_ROWS, 768)
    threads = torch.get_num_threads()
    out = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            with torch.no_grad():
                out[n] = (*mamba_step(u, xp, z, dt_w, dt_b, A, D, s), *conv_step(x, st, w, b, True),
                          rms_rows(rows, None, 1e-5))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(out[1], out[2]))


@needs_kernel
def test_what_stays_on_torch(monkeypatch):
    """A wanted gradient, another dtype, a layout the kernel does not read, a conv of one tap, more rows than a
    decoding step's for the norm, and LINLM_SCAN_BACKEND=torch keep torch's ops."""
    x, st, w, b = conv_operands(2, 64, 4, True)
    args = list(mamba_operands(2, 64, 16, 4))
    rows = torch.randn(2, 64)
    with torch.no_grad():
        assert not conv_step_takes(x, st, w, b[:32])
        assert not conv_step_takes(x, st, torch.randn(64, 1), b)  # K = 1: no window
        assert not conv_step_takes(x.double(), st.double(), w.double(), b.double())
        assert not conv_step_takes(x, st.transpose(1, 2).contiguous().transpose(1, 2), w, b)
        assert not mamba_step_takes(*args[:5], args[5].t().contiguous().t(), *args[6:])  # A column-major
        assert not mamba_step_takes(args[0][:, ::2], *args[1:])
        assert not mamba_step_takes(*args[:7], args[7][:1])
        assert not rms_rows_takes(torch.randn(RMS_MAX_ROWS + 1, 64), None)
        assert not rms_rows_takes(rows.t(), None)
        assert not rms_rows_takes(rows.bfloat16(), None)
    w.requires_grad_(True)
    assert not conv_step_takes(x, st, w, b)
    with torch.no_grad():
        assert conv_step_takes(x, st, w, b)  # no gradient wanted here
        monkeypatch.setenv("LINLM_SCAN_BACKEND", "torch")
        assert not conv_step_takes(x, st, w, b)
        assert not mamba_step_takes(*args)
        assert not rms_rows_takes(rows, None)


@needs_kernel
def test_rms_norm_of_a_step_takes_the_kernel(monkeypatch):
    calls = []
    real = step_kernel.rms_rows
    monkeypatch.setattr(step_kernel, "rms_rows", lambda *a: calls.append(1) or real(*a))
    x, w = torch.randn(1, 1, 96), torch.randn(96)
    with torch.no_grad():
        got = rms_norm(x, w, 1e-6)
    assert calls and got.shape == x.shape
    torch.testing.assert_close(got, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)


def on_one_and_two_threads(fn):
    """{1: fn() on one thread, 2: fn() on two}."""
    threads = torch.get_num_threads()
    out = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out[n] = fn()
    finally:
        torch.set_num_threads(threads)
    return out


def layer_steps(monkeypatch):
    """Decoding steps through the layers: not the whole model's step in one call (tests/models/test_fused_step.py),
    which would take the calls these tests count."""
    monkeypatch.setattr(lm_module, "fused_step", lambda *a: None)


def spy(monkeypatch, calls, name):
    """Count the calls of step_kernel.<name> in calls[name]."""
    real = getattr(step_kernel, name)
    calls[name] = 0

    def counted(*a):
        calls[name] += 1
        return real(*a)

    monkeypatch.setattr(step_kernel, name, counted)


def decode(model, ids):
    """Logits of steps 1.. after a one-token prefill, and the final state."""
    with torch.no_grad():
        state = model(ids[:, :1], return_state=True).state
        out = []
        for t in range(1, ids.shape[1]):
            logits, state = model.step(ids[:, t], state)
            out.append(logits)
    return torch.stack(out), state


def assert_decodes_alike(got, ref):
    (got, got_state), (ref, ref_state) = got, ref
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_state.layers, ref_state.layers):
        torch.testing.assert_close(a["ssm"], b["ssm"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a["conv"], b["conv"], rtol=1e-5, atol=1e-6)


def torch_ops_only(monkeypatch):
    for name in ("conv_step_takes", "mamba_step_takes", "rms_rows_takes", "mamba_mixer_step_takes"):
        monkeypatch.setattr(step_kernel, name, lambda *a: False)


@needs_kernel
@pytest.mark.parametrize("fused", [True, False])
def test_a_mamba_model_decodes_through_the_kernels_as_through_torch(monkeypatch, fused):
    """Five steps of a 2-layer Mamba at batch 2: every layer's mixer takes the fused step (or, with it off, the conv
    and scan steps), every norm the norm kernel, and the logits and states follow the torch ops' within float32
    rounding."""
    layer_steps(monkeypatch)
    torch.manual_seed(0)
    model = linlm.create_model("mamba", None, n_layers=2, d_model=64, vocab_size=97).eval()
    ids = torch.randint(0, 97, (2, 6))
    calls = {}
    for name in ("conv_step", "mamba_step", "mamba_mixer_step", "rms_rows"):
        spy(monkeypatch, calls, name)
    if not fused:
        monkeypatch.setattr(step_kernel, "mamba_mixer_step_takes", lambda *a: False)
    got = decode(model, ids)
    steps = 2 * 5
    assert calls == ({"conv_step": 0, "mamba_step": 0, "mamba_mixer_step": steps, "rms_rows": 3 * 5 + 3} if fused
                     else {"conv_step": steps, "mamba_step": steps, "mamba_mixer_step": 0, "rms_rows": 3 * 5 + 3})
    torch_ops_only(monkeypatch)
    assert_decodes_alike(got, decode(model, ids))


@needs_kernel
def test_the_fused_step_gives_the_same_bits_on_one_and_two_threads_and_with_a_bias():
    """Projections with biases (HF's use_bias), a conv without one, and the OpenMP team's split of each stage."""
    torch.manual_seed(1)
    model = linlm.create_model("mamba", None, n_layers=2, d_model=64, vocab_size=97).eval()
    mixer = model.layers[0].mixer
    with torch.no_grad():
        for lin in (mixer.in_proj, mixer.x_proj, mixer.out_proj):
            lin.bias = torch.nn.Parameter(torch.randn(lin.out_features))
    mixer.conv.bias = None
    ids = torch.randint(0, 97, (3, 4))
    out = on_one_and_two_threads(lambda: decode(model, ids))
    assert torch.equal(out[1][0], out[2][0])
    with pytest.MonkeyPatch.context() as mp:
        torch_ops_only(mp)
        assert_decodes_alike(out[1], decode(model, ids))


@needs_kernel
def test_what_the_fused_step_leaves_to_the_layers(monkeypatch):
    """A forward hook on a projection is still called (the mixer then steps through its modules), and a batch of
    more rows than a decoding step's keeps the modules too."""
    layer_steps(monkeypatch)
    torch.manual_seed(2)
    model = linlm.create_model("mamba", None, n_layers=1, d_model=32, vocab_size=50).eval()
    calls = {}
    spy(monkeypatch, calls, "mamba_mixer_step")
    seen = []
    handle = model.layers[0].mixer.x_proj.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    decode(model, torch.randint(0, 50, (2, 3)))
    assert calls["mamba_mixer_step"] == 0 and len(seen) == 1 + 2  # the prefill's call and two steps'
    handle.remove()
    decode(model, torch.randint(0, 50, (9, 3)))
    assert calls["mamba_mixer_step"] == 0
    decode(model, torch.randint(0, 50, (8, 3)))
    assert calls["mamba_mixer_step"] == 2


@needs_kernel
@pytest.mark.skipif(not {"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines),
                    reason="no fbgemm int8 kernels: int8 models do not load")
def test_an_int8_mamba_steps_through_the_fused_kernel_as_through_its_layers(monkeypatch):
    """With int8 projections the fused step reads q and the row scales itself: the same bits as the layers' own
    int8 kernel calls one by one (each product quantises its input the same way), on 1 and 2 threads."""
    layer_steps(monkeypatch)
    from linlm.models.quant import quantize_model

    torch.manual_seed(3)
    model = quantize_model(linlm.create_model("mamba", None, n_layers=2, d_model=64, vocab_size=97).eval())
    ids = torch.randint(0, 97, (3, 5))
    calls = {}
    spy(monkeypatch, calls, "mamba_mixer_step")
    out = on_one_and_two_threads(lambda: decode(model, ids))
    assert calls["mamba_mixer_step"] == 2 * 2 * 4
    assert torch.equal(out[1][0], out[2][0])
    monkeypatch.setattr(step_kernel, "mamba_mixer_step_takes", lambda *a: False)
    layers = decode(model, ids)
    assert torch.equal(out[1][0], layers[0])
    for a, b in zip(out[1][1].layers, layers[1].layers):
        assert torch.equal(a["ssm"], b["ssm"]) and torch.equal(a["conv"], b["conv"])
