"""The delta rule on the GPU backend (linlm.ops.backends.delta_rule): fla's chunk_delta_rule and
chunk_gated_delta_rule.

As in test_gpu_backends.py: on every machine, the dispatch decision and the argument mapping against stand-ins that
follow fla's documented contract (scale K^-1/2 by default, beta required, float32 states [N, H, K, V], cu_seqlens
with one row, use_qk_l2norm_in_kernel) and compute with linlm's reference; where CUDA and fla are present, the real
kernels against the reference (skipped elsewhere).
"""

from __future__ import annotations

import pytest
import torch
from test_gpu_backends import (GLA_OK, _counting, _cuda, _fake_fla, _needs, _reset, _with_grads, err_ratio, gpu_test,
                               poison_empty)  # noqa: F401  (poison_empty: the autouse fixture, for these tests too)

from linlm.ops import backends
from linlm.ops.delta_rule import delta_rule, delta_rule_reference


def test_choose_for_the_delta_rule():
    """The GLA decision, plus fla's largest head dim for the delta rule."""
    ok = dict(GLA_OK, max_head_dim=backends.FLA_MAX_DELTA_HEAD_DIM)
    assert backends.choose_gla(**ok) == "fla"
    assert backends.choose_gla(**{**ok, "head_dims": (256, 256)}) == "fla"
    assert backends.choose_gla(**{**ok, "head_dims": (64, 257)}) == "torch"
    assert backends.choose_gla(**{**ok, "head_dims": (64, 257), "max_head_dim": None}) == "fla"


def _inputs(gated, B=2, T=37, H=3, K=16, V=24, seed=0, dtype=torch.float32, init=True, beta=True):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x = dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, H, V),
             beta=torch.rand(B, T, H, generator=g) if beta else None,
             log_a=-torch.rand(B, T, H, generator=g) if gated else None,
             initial_state=r(B, H, K, V) if init else None)
    return {n: None if t is None else (t.to(dtype) if n in ("q", "k", "v") else t) for n, t in x.items()}


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("with_reset", [False, True])
@pytest.mark.parametrize("beta", [False, True])
def test_fla_delta_mapping_matches_reference(gated, with_reset, beta):
    x = _inputs(gated, seed=int(gated) + 2 * int(beta), beta=beta)
    reset = _reset(2, 37, 5) if with_reset else None

    def via_fla(q, k, v, beta, log_a, initial_state):
        return backends._run_fla_delta(_fake_fla(), q, k, v, beta, log_a, initial_state, reset, True, 0.25, True)

    def ref(q, k, v, beta, log_a, initial_state):
        return delta_rule_reference(q, k, v, beta, log_a, initial_state=initial_state, reset=reset, scale=0.25,
                                    qk_l2norm=True)

    o, ht, grads = _with_grads(via_fla, x)
    o_ref, ht_ref, grads_ref = _with_grads(ref, x)
    assert o.dtype == o_ref.dtype and ht.dtype == torch.float32 and ht.shape == ht_ref.shape
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ht, ht_ref, rtol=1e-5, atol=1e-5)
    assert grads.keys() == grads_ref.keys()
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-4, atol=1e-4, msg=name)


def test_fla_delta_mapping_keeps_dtypes_and_drops_the_final_state():
    x = _inputs(True, dtype=torch.bfloat16, init=False)
    o, ht = backends._run_fla_delta(_fake_fla(), x["q"], x["k"], x["v"], x["beta"], x["log_a"], None, None, False,
                                    1.0, True)
    assert o.dtype == torch.bfloat16 and ht is None


def test_dispatch_reaches_the_stand_in(monkeypatch):
    """delta_rule on a tensor the backend takes for CUDA: it checks the inputs, then calls fla (the stand-in)."""
    torch.use_deterministic_algorithms(False)
    calls = []
    fake = _fake_fla()
    real = fake.chunk_gated_delta_rule
    fake.chunk_gated_delta_rule = lambda *a, **k: calls.append(1) or real(*a, **k)
    monkeypatch.setattr(backends, "_device_type", lambda t: "cuda")
    monkeypatch.setattr(backends, "on_gpu", lambda t: True)
    monkeypatch.setattr(backends, "_fla", lambda: fake)
    x = _inputs(True)
    o, ht = delta_rule(**x, qk_l2norm=True)
    o_ref, ht_ref = delta_rule_reference(**x, qk_l2norm=True)
    assert calls == [1]
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    with backends.gpu_kernels("torch"):
        delta_rule(**x, qk_l2norm=True)
    assert calls == [1]
    x["beta"][0, 0, 0] = 3.0  # refused before fla is asked
    with pytest.raises(Exception, match="beta must lie in"):
        delta_rule(**x, qk_l2norm=True)
    assert calls == [1]


# fla's float32 matmuls run in TF32 and its bfloat16 path rounds intermediate states (test_gpu_backends.py, FLA_TOL)
FLA_TOL = {torch.float32: 5e-3, torch.bfloat16: 2e-2}


@gpu_test
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("init", [False, True])
@pytest.mark.parametrize("with_reset", [False, True])
def test_fla_delta_against_reference(dtype, gated, init, with_reset):
    _needs("fla")
    x = _cuda(_inputs(gated, B=2, T=200, H=2, K=32, V=64, seed=7, init=init), dtype)
    reset = _reset(2, 200, 11).cuda() if with_reset else None
    with _counting("_run_fla_delta") as calls:
        o, ht, grads = _with_grads(lambda **a: delta_rule(**a, reset=reset, qk_l2norm=True, scale=32 ** -0.5), x)
    assert calls, "fla was not used"
    ref_in = {n: None if t is None else t.float() for n, t in x.items()}
    o_ref, ht_ref, grads_ref = _with_grads(
        lambda **a: delta_rule_reference(**a, reset=reset, qk_l2norm=True, scale=32 ** -0.5), ref_in)
    tol = FLA_TOL[dtype]
    assert o.dtype == dtype and ht.dtype == torch.float32
    assert err_ratio(o, o_ref) < tol and err_ratio(ht, ht_ref) < tol
    for name, want in grads_ref.items():
        assert err_ratio(grads[name], want) < 2 * tol, name
