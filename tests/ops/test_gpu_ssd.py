"""Mamba-2's SSD on mamba_ssm (linlm.ops.backends.ssd): the dispatch decision, and the argument mapping run against
a stand-in for ``mamba_chunk_scan_combined`` that follows its documented contract (x [b, l, h, p], dt [b, l, h],
A [h], B and C [b, l, g, n], states [b, h, p, n], packed documents as ``seq_idx``) and computes with linlm's
reference. Where CUDA and mamba_ssm are present (skipped elsewhere): the real kernel against the reference."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from linlm.ops import backends
from linlm.ops.gla import gla_reference

F64 = torch.float64


def fake_mamba_ssd():
    def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                  seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                  return_final_states=False, return_varlen_states=False):
        b, l, h, p = x.shape
        g, n = B.shape[2:]
        assert h % g == 0 and B.shape == C.shape == (b, l, g, n) and dt.shape == (b, l, h) and A.shape == (h,)
        assert x.dtype in (torch.float32, torch.bfloat16, torch.float16) and B.dtype == C.dtype == x.dtype
        assert A.dtype == torch.float32 and isinstance(chunk_size, int) and chunk_size > 0
        assert D is None and z is None and dt_bias is None and not dt_softplus  # linlm keeps those in its layer
        assert initial_states is None or (initial_states.shape == (b, h, p, n)
                                          and initial_states.dtype == torch.float32)
        reset = None
        if seq_idx is not None:
            assert seq_idx.dtype == torch.int32 and seq_idx.shape == (b, l)
            reset = torch.zeros(b, l, dtype=torch.bool)
            reset[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]  # a new document where the index changes
        x32, dt32 = x.float(), dt.float()
        init = None if initial_states is None else initial_states.transpose(-1, -2)
        y, last = gla_reference(C.float(), B.float(), x32 * dt32.unsqueeze(-1), dt32 * A, initial_state=init,
                                reset=reset)
        y = y.to(x.dtype)
        return (y, last.transpose(-1, -2)) if return_final_states else y

    return SimpleNamespace(mamba_chunk_scan_combined=mamba_chunk_scan_combined)


def test_choose_ssd():
    ok = dict(device_type="cuda", dtypes=[torch.bfloat16, torch.float32], seq_len=64, state_size=128, head_dim=64,
              mamba_available=True)
    assert backends.choose_ssd(**ok) == "mamba_ssm"
    for change in ({"device_type": "cpu"}, {"mode": "torch"}, {"exporting": True}, {"deterministic": True},
                   {"seq_len": 0}, {"dtypes": [torch.float64]}, {"state_size": 257}, {"head_dim": 257},
                   {"mamba_available": False}):
        assert backends.choose_ssd(**{**ok, **change}) == "torch", change
    asked = []
    backends.choose_ssd(**{**ok, "device_type": "cpu", "mamba_available": lambda: asked.append(1) or True})
    assert not asked, "the import was attempted for a call that never uses it"


def _inputs(B=2, T=45, H=4, G=2, P=6, N=5, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(u=r(B, T, H, P).to(dtype), dt=torch.nn.functional.softplus(r(B, T, H) - 1.0),
                A=-torch.rand(H, generator=g) * 4 - 0.5, B=r(B, T, G, N).to(dtype), C=r(B, T, G, N).to(dtype),
                initial_state=r(B, H, N, P))


def _as_gla(u, dt, A, B, C, initial_state, reset, output_final_state):
    """The same recurrence as linlm computes it without the library: gla with q = C, k = B, v = dt u, log a = dt A."""
    return gla_reference(C, B, u * dt.unsqueeze(-1), dt * A, initial_state=initial_state, reset=reset,
                         output_final_state=output_final_state)


def _grads(fn, x, seed=1):
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items() if t is not None}
    y, s = fn(**{n: leaves.get(n) for n in x})
    g = torch.Generator().manual_seed(seed)
    loss = (y.double() * torch.randn(y.shape, generator=g, dtype=F64)).sum()
    if s is not None:
        loss = loss + (s.double() * torch.randn(s.shape, generator=g, dtype=F64)).sum()
    loss.backward()
    return y.detach(), None if s is None else s.detach(), {n: t.grad for n, t in leaves.items()}


@pytest.mark.parametrize("with_reset", [False, True])
@pytest.mark.parametrize("init", [False, True])
@pytest.mark.parametrize("final", [False, True])
def test_ssd_mapping_matches_reference(with_reset, init, final):
    x = _inputs(seed=int(with_reset) + 2 * int(init) + 4 * int(final))
    if not init:
        x["initial_state"] = None
    reset = None
    if with_reset:
        reset = torch.zeros(2, 45, dtype=torch.bool)
        reset[0, 0] = reset[0, 17] = reset[1, 30] = True  # row 0 starts with one: it starts from zeros

    def mapped(u, dt, A, B, C, initial_state):
        return backends._run_mamba_ssd(fake_mamba_ssd(), u, dt, A, B, C, initial_state, reset, final, 16)

    def reference(u, dt, A, B, C, initial_state):
        return _as_gla(u, dt, A, B, C, initial_state, reset, final)

    got, want = _grads(mapped, x), _grads(reference, x)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert (got[1] is None) == (not final)
    if final:
        assert got[1].shape == (2, 4, 5, 6) and got[1].dtype == torch.float32
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-4, atol=1e-5, msg=name)


def test_ssd_mapping_keeps_dtypes_and_broadcasts_a_reset_row():
    x = _inputs(dtype=torch.bfloat16)
    reset = torch.zeros(1, 45, dtype=torch.bool)
    reset[0, 9] = True
    y, s = backends._run_mamba_ssd(fake_mamba_ssd(), *x.values(), reset, True, 64)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32
    y_ref, s_ref = _as_gla(**{n: (t.float() if t.dtype == torch.bfloat16 else t) for n, t in x.items()},
                           reset=reset, output_final_state=True)
    torch.testing.assert_close(y, y_ref.to(torch.bfloat16), rtol=0, atol=0)
    torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-5)


def test_ssd_is_not_asked_on_the_cpu(monkeypatch):
    monkeypatch.setattr(backends, "_mamba_ssd", lambda: pytest.fail("the library was looked for on the CPU"))
    x = _inputs()
    assert backends.ssd(*[x[n] for n in ("u", "dt", "A", "B", "C")], initial_state=x["initial_state"]) is None


# ---------------------------------------------------------------------------------------------------------------------
# on a GPU, with the real kernel

gpu_test = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@gpu_test
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_reset", [False, True])
def test_mamba_ssd_against_reference(dtype, with_reset):
    if not backends.available("mamba_ssm.ssd"):
        pytest.skip("needs mamba_ssm's Triton kernels (pip install 'linlm[gpu]')")
    x = _inputs(B=2, T=300, H=8, G=2, P=64, N=64, dtype=dtype)
    reset = None
    if with_reset:
        reset = torch.zeros(2, 300, dtype=torch.bool)
        reset[0, 100] = reset[1, 0] = reset[1, 250] = True
    want = _grads(lambda **a: _as_gla(**{n: t.double() for n, t in a.items()}, reset=reset,
                                      output_final_state=True), x)
    cuda = {n: t.cuda() for n, t in x.items()}
    rc = None if reset is None else reset.cuda()
    got = _grads(lambda **a: backends.ssd(a["u"], a["dt"], a["A"], a["B"], a["C"], initial_state=a["initial_state"],
                                          reset=rc, chunk_size=64), cuda)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(got[0].double().cpu(), want[0], rtol=tol, atol=tol)
    torch.testing.assert_close(got[1].double().cpu(), want[1], rtol=tol, atol=tol)
    for name in want[2]:
        torch.testing.assert_close(got[2][name].double().cpu(), want[2][name], rtol=tol * 5, atol=tol * 5, msg=name)
