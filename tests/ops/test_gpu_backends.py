"""The GPU backend (linlm.ops.backends): flash-linear-attention for gla, mamba_ssm for the selective scan.

Two halves:

- On every machine: the switch (LINLM_GPU_KERNELS and gpu_kernels()), the dispatch decisions (pure functions, fed
  fake availability), that CPU calls never look for either library, and the argument mapping itself, run against
  stand-ins for fla's and mamba_ssm's functions that follow those libraries' documented contracts (fla: scale
  K^-1/2 by default, float32 states [N, H, K, V], cu_seqlens with one row, no gradient for g_gamma; mamba_ssm:
  time-last layout, dtype rules of selective_scan_cuda, no gradient through the last state) and compute with
  linlm's references.
- Where CUDA and the library are present (skipped elsewhere): the real kernels against linlm's references, outputs,
  final states and every gradient, in float32 and bfloat16, and LINLM_GPU_KERNELS=torch really bypassing them.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from types import SimpleNamespace

import pytest
import torch

from linlm.errors import ConfigError
from linlm.ops import backends
from linlm.ops.delta_rule import delta_rule_reference
from linlm.ops.gla import gla, gla_reference
from linlm.ops.selective_scan import selective_scan, selective_scan_reference
from test_gpu_ssd import fake_mamba_ssd

KINDS = ("none", "head", "scalar", "vector")


def gpu_test(fn):
    """A test that needs a CUDA GPU: skipped without one, and run outside torch's deterministic mode (below)."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(fn))


@pytest.fixture(autouse=True)
def poison_empty(request):
    """tests/ops' NaN poisoning (conftest.py) for the CPU tests. It works through torch's deterministic mode, under
    which linlm.ops.backends does not use the libraries at all (and cuBLAS would need CUBLAS_WORKSPACE_CONFIG), so
    the GPU tests run without it."""
    if request.node.get_closest_marker("gpu") is not None:
        yield
        return
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(was)


def err_ratio(got: torch.Tensor, want: torch.Tensor) -> float:
    """RMS of the difference over the RMS of the reference (NaN anywhere gives inf)."""
    got, want = got.detach().double(), want.detach().double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - want).square().mean().sqrt() / (want.square().mean().sqrt() + 1e-12))


# ---------------------------------------------------------------------------------------------------------------------
# the switch


def test_mode_reads_env_and_context(monkeypatch):
    monkeypatch.delenv(backends.ENV, raising=False)
    assert backends.mode() == "auto"
    monkeypatch.setenv(backends.ENV, " Torch ")
    assert backends.mode() == "torch"
    with backends.gpu_kernels("auto"):
        assert backends.mode() == "auto"
        with backends.gpu_kernels("torch"):
            assert backends.mode() == "torch"
        assert backends.mode() == "auto"
    assert backends.mode() == "torch"


def test_invalid_mode_is_a_config_error(monkeypatch):
    monkeypatch.setenv(backends.ENV, "triton")
    with pytest.raises(ConfigError, match=r"LINLM_GPU_KERNELS='triton'.*auto, torch"):
        backends.mode()
    with pytest.raises(ConfigError, match=r"gpu_kernels='fast'.*auto, torch"):
        with backends.gpu_kernels("fast"):
            pass
    with pytest.raises(ConfigError, match="fla, mamba_ssm"):
        backends.available("flash")


# ---------------------------------------------------------------------------------------------------------------------
# the decisions


def _never():
    raise AssertionError("availability was asked for although nothing else allowed the library")


GLA_OK = dict(device_type="cuda", dtypes=[torch.bfloat16] * 3, head_dims=(64, 64), seq_len=100, mode="auto",
              fla_available=True)


def test_choose_gla():
    assert backends.choose_gla(**GLA_OK) == "fla"
    assert backends.choose_gla(**{**GLA_OK, "dtypes": [torch.float32] * 3}) == "fla"
    assert backends.choose_gla(**{**GLA_OK, "dtypes": [torch.bfloat16, torch.float32, torch.bfloat16]}) == "fla"
    assert backends.choose_gla(**{**GLA_OK, "head_dims": (16, 1024)}) == "fla"
    for change in ({"device_type": "cpu"}, {"mode": "torch"}, {"fla_available": False}, {"exporting": True},
                   {"deterministic": True},
                   {"seq_len": 0}, {"dtypes": [torch.float64, torch.float32, torch.float32]},
                   {"head_dims": (8, 64)}, {"head_dims": (64, 15)}, {"float64_state": True}):
        assert backends.choose_gla(**{**GLA_OK, **change}) == "torch", change
    # the library is only loaded when everything else allows it
    for change in ({"device_type": "cpu"}, {"mode": "torch"}, {"dtypes": [torch.float64] * 3}):
        assert backends.choose_gla(**{**GLA_OK, **change, "fla_available": _never}) == "torch"
    assert backends.choose_gla(**{**GLA_OK, "fla_available": lambda: True}) == "fla"
    # chunk_simple_gla's gated backward, where fla cannot run it (Hopper with an affected Triton)
    assert backends.choose_gla(**GLA_OK, gated_backward=True, gated_backward_ok=lambda: False) == "torch"
    assert backends.choose_gla(**GLA_OK, gated_backward=True, gated_backward_ok=lambda: True) == "fla"
    assert backends.choose_gla(**GLA_OK, gated_backward=False, gated_backward_ok=_never) == "fla"


@pytest.mark.parametrize("capability, triton_version, nvcc, ok", [
    ((8, 0), "3.5.0", None, True), ((9, 0), "3.3.1", None, True), ((9, 0), "3.4.0", None, False),
    ((9, 0), "3.7.0+git1a2b", None, False), ((9, 0), "3.7.1", None, True), ((10, 0), "3.5.0", None, True),
])
def test_fla_gated_backward_probe(monkeypatch, capability, triton_version, nvcc, ok):
    backends.fla_gated_backward_ok.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    monkeypatch.setitem(sys.modules, "triton", SimpleNamespace(__version__=triton_version))
    monkeypatch.setattr(backends.shutil, "which", lambda name: nvcc)
    try:
        assert backends.fla_gated_backward_ok(0) is ok
    finally:
        backends.fla_gated_backward_ok.cache_clear()


def test_fla_version_floor():
    assert backends.fla_version_ok("0.5.2") and backends.fla_version_ok("0.6.0") and backends.fla_version_ok("1.0")
    assert backends.fla_version_ok("0.5.10.dev3")
    assert not backends.fla_version_ok("0.5.1") and not backends.fla_version_ok("0.4.2")
    assert not backends.fla_version_ok("0")


@pytest.mark.parametrize("version, usable", [("0.4.2", False), ("0.5.2", True)])
def test_fla_loader_checks_the_version(monkeypatch, version, usable):
    """_fla() loads chunk_gla, chunk_simple_gla, chunk_delta_rule and chunk_gated_delta_rule (here from stand-in
    modules) and refuses an fla too old for the mapping, with a warning."""
    import importlib.machinery
    from types import ModuleType

    fake = _fake_fla()
    for name, attrs in (("fla", {"__version__": version}), ("fla.ops", {}),
                        ("fla.ops.gla", {"chunk_gla": fake.chunk_gla}),
                        ("fla.ops.simple_gla", {"chunk_simple_gla": fake.chunk_simple_gla}),
                        ("fla.ops.delta_rule", {"chunk_delta_rule": fake.chunk_delta_rule}),
                        ("fla.ops.gated_delta_rule", {"chunk_gated_delta_rule": fake.chunk_gated_delta_rule})):
        module = ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        vars(module).update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    backends._fla.cache_clear()
    try:
        if usable:
            fla = backends._fla()
            assert fla.chunk_gla is fake.chunk_gla and backends.available("fla")
            assert fla.chunk_delta_rule is fake.chunk_delta_rule
            assert fla.chunk_gated_delta_rule is fake.chunk_gated_delta_rule
        else:
            with pytest.warns(RuntimeWarning, match="fla 0.4.2 is older than 0.5.2"):
                assert backends._fla() is None
    finally:
        backends._fla.cache_clear()


SCAN_OK = dict(device_type="cuda", dtypes=[torch.bfloat16, torch.float32, torch.bfloat16, torch.bfloat16],
               seq_len=100, state_size=16, batched_A=False, batched_D=False, initial_state=False, reset=False,
               final_state_grad=False, mode="auto", mamba_available=True)


def test_choose_scan():
    assert backends.choose_scan(**SCAN_OK) == "mamba_ssm"
    assert backends.choose_scan(**{**SCAN_OK, "state_size": 256}) == "mamba_ssm"
    for change in ({"device_type": "cpu"}, {"mode": "torch"}, {"mamba_available": False}, {"exporting": True},
                   {"deterministic": True},
                   {"seq_len": 0}, {"dtypes": [torch.float64] * 4}, {"state_size": 257}, {"batched_A": True},
                   {"batched_D": True}, {"initial_state": True}, {"reset": True}, {"final_state_grad": True}):
        assert backends.choose_scan(**{**SCAN_OK, **change}) == "torch", change
    assert backends.choose_scan(**{**SCAN_OK, "initial_state": True, "mamba_available": _never}) == "torch"


class _ImportRecorder(importlib.abc.MetaPathFinder):
    """Records every lookup of fla or mamba_ssm (find_spec and import both pass through sys.meta_path)."""

    def __init__(self):
        self.asked = []

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fla", "mamba_ssm"):
            self.asked.append(name)
        return None


@pytest.mark.parametrize("scan_backend", ["auto", "torch"])
def test_cpu_calls_never_look_for_the_libraries(monkeypatch, scan_backend):
    monkeypatch.setenv("LINLM_SCAN_BACKEND", scan_backend)  # torch: selective_scan passes the CUDA branch point
    for name in [m for m in sys.modules if m.split(".")[0] in ("fla", "mamba_ssm")]:
        monkeypatch.delitem(sys.modules, name)
    backends._fla.cache_clear()
    backends._mamba.cache_clear()
    recorder = _ImportRecorder()
    monkeypatch.setattr(sys, "meta_path", [recorder, *sys.meta_path])
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 20, 2, 16, generator=g) for _ in range(3))
    for log_a in (None, -torch.rand(2, generator=g), -torch.rand(2, 20, 2, generator=g),
                  -torch.rand(2, 20, 2, 16, generator=g)):
        gla(q, k, v, log_a)
    from linlm.ops.delta_rule import delta_rule

    delta_rule(q, k, v, torch.rand(2, 20, 2, generator=g), -torch.rand(2, 20, 2, generator=g), qk_l2norm=True)
    u, dt = torch.randn(2, 20, 8, generator=g), torch.randn(2, 20, 8, generator=g)
    A, Bm, Cm = -torch.rand(8, 4, generator=g), torch.randn(2, 20, 4, generator=g), torch.randn(2, 20, 4, generator=g)
    selective_scan(u, dt, A, Bm, Cm, torch.ones(8), dt_softplus=True)
    assert recorder.asked == []
    assert backends._fla.cache_info().currsize == 0 and backends._mamba.cache_info().currsize == 0


# ---------------------------------------------------------------------------------------------------------------------
# the argument mapping, against stand-ins that follow the libraries' contracts


def _per_sequence(run, q, cu_seqlens, initial_state, output_final_state):
    """Run run(lo, hi, h0) per sequence of cu_seqlens (fla's varlen contract: one row); cat o, stack states."""
    if cu_seqlens is None:
        return run(0, q.shape[1], initial_state, batch=True, ofs=output_final_state)
    assert q.shape[0] == 1, "fla takes cu_seqlens with a batch of one row"
    bounds = cu_seqlens.tolist()
    outs, finals = [], []
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        h0 = None if initial_state is None else initial_state[i: i + 1]
        o, ht = run(lo, hi, h0, batch=False, ofs=True)
        outs.append(o)
        finals.append(ht)
    return torch.cat(outs, dim=1), (torch.cat(finals) if output_final_state else None)


def _fake_fla():
    def check_common(q, k, v, initial_state, cu_seqlens, cu_seqlens_cpu):
        assert q.dim() == 4 and k.shape == q.shape and v.shape[:3] == q.shape[:3], "fla takes [B, T, H, dim]"
        assert q.dtype == k.dtype == v.dtype
        assert initial_state is None or initial_state.dtype == torch.float32, "initial_state must be in float32."
        if cu_seqlens is not None:
            assert cu_seqlens.dtype == torch.int64 and cu_seqlens.device == q.device
            assert torch.equal(cu_seqlens.cpu(), cu_seqlens_cpu)
            assert initial_state is None or initial_state.shape[0] == len(cu_seqlens) - 1

    def run_ref(q, k, v, gate_of, scale, initial_state, output_final_state, cu_seqlens):
        def run(lo, hi, h0, batch, ofs):
            o, ht = gla_reference(q[:, lo:hi] * scale, k[:, lo:hi], v[:, lo:hi], gate_of(lo, hi), initial_state=h0,
                                  output_final_state=ofs)
            return o, ht
        o, ht = _per_sequence(run, q, cu_seqlens, initial_state, output_final_state)
        return o.to(q.dtype), ht

    def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, state_v_first=False,
                  cu_seqlens=None, cu_seqlens_cpu=None):
        check_common(q, k, v, initial_state, cu_seqlens, cu_seqlens_cpu)
        assert g.shape == q.shape
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return run_ref(q, k, v, lambda lo, hi: g[:, lo:hi], scale, initial_state, output_final_state, cu_seqlens)

    def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                         state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
        check_common(q, k, v, initial_state, cu_seqlens, cu_seqlens_cpu)
        assert g is None or g_gamma is None
        assert g is None or g.shape == q.shape[:3]
        assert g_gamma is None or g_gamma.shape == (q.shape[2],)
        scale = k.shape[-1] ** -0.5 if scale is None else scale
        if g is not None:
            gate_of = lambda lo, hi: g[:, lo:hi]  # noqa: E731
        elif g_gamma is not None:
            gate_of = lambda lo, hi: g_gamma.detach()  # noqa: E731  fla returns no gradient for g_gamma
        else:
            gate_of = lambda lo, hi: None  # noqa: E731
        return run_ref(q, k, v, gate_of, scale, initial_state, output_final_state, cu_seqlens)

    def delta(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
              cu_seqlens_cpu):
        check_common(q, k, v, initial_state, cu_seqlens, cu_seqlens_cpu)
        assert beta is not None and beta.shape == q.shape[:3], "fla takes beta [B, T, H]"
        assert g is None or (g.shape == q.shape[:3] and g.dtype == torch.float32)
        scale = k.shape[-1] ** -0.5 if scale is None else scale

        def run(lo, hi, h0, batch, ofs):
            return delta_rule_reference(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], beta[:, lo:hi],
                                        None if g is None else g[:, lo:hi], initial_state=h0, output_final_state=ofs,
                                        scale=scale, qk_l2norm=use_qk_l2norm_in_kernel)
        o, ht = _per_sequence(run, q, cu_seqlens, initial_state, output_final_state)
        return o.to(q.dtype), ht

    def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                         cu_seqlens=None, cu_seqlens_cpu=None, use_qk_l2norm_in_kernel=False):
        return delta(q, k, v, None, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                     cu_seqlens, cu_seqlens_cpu)

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None):
        return delta(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                     cu_seqlens, cu_seqlens_cpu)

    return SimpleNamespace(chunk_gla=chunk_gla, chunk_simple_gla=chunk_simple_gla, chunk_delta_rule=chunk_delta_rule,
                           chunk_gated_delta_rule=chunk_gated_delta_rule)


def _gla_inputs(kind, B=2, T=37, H=3, K=16, V=24, seed=0, dtype=torch.float32, init=True):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x = dict(q=r(B, T, H, K), k=r(B, T, H, K) / K**0.5, v=r(B, T, H, V),
             log_a={"none": None, "head": -torch.rand(H, generator=g), "scalar": -torch.rand(B, T, H, generator=g),
                    "vector": -torch.rand(B, T, H, K, generator=g)}[kind],
             initial_state=r(B, H, K, V) if init else None)
    return {n: None if t is None else (t if n in ("log_a", "initial_state") else t.to(dtype)) for n, t in x.items()}


def _with_grads(fn, inputs, seed=1):
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in inputs.items() if t is not None}
    o, ht = fn(**{n: leaves.get(n) for n in inputs})
    g = torch.Generator().manual_seed(seed)
    loss = (o.float() * torch.randn(o.shape, generator=g).to(o.device)).sum()
    if ht is not None:
        loss = loss + (ht * torch.randn(ht.shape, generator=g).to(ht.device)).sum()
    loss.backward()
    return o, ht, {n: t.grad for n, t in leaves.items()}


def _reset(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    reset = torch.rand(B, T, generator=g) < 0.1
    reset[0, 0] = True  # a row that starts a document drops its initial state
    reset[1, 0] = False
    return reset


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_reset", [False, True])
def test_fla_mapping_matches_reference(kind, with_reset):
    x = _gla_inputs(kind, seed=KINDS.index(kind))
    reset = _reset(2, 37, 5) if with_reset else None
    kind_of = kind
    fake = _fake_fla()

    def via_fla(q, k, v, log_a, initial_state):
        return backends._run_fla(fake, q, k, v, log_a, kind_of, initial_state, reset, True)

    def ref(q, k, v, log_a, initial_state):
        return gla_reference(q, k, v, log_a, initial_state=initial_state, reset=reset)

    o, ht, grads = _with_grads(via_fla, x)
    o_ref, ht_ref, grads_ref = _with_grads(ref, x)
    assert o.dtype == o_ref.dtype and ht.dtype == torch.float32 and ht.shape == ht_ref.shape
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ht, ht_ref, rtol=1e-5, atol=1e-5)
    assert grads.keys() == grads_ref.keys()
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-4, atol=1e-4, msg=name)


def test_fla_mapping_reset_of_one_row_broadcasts_and_no_final_state():
    x = _gla_inputs("scalar", init=False)
    reset = _reset(2, 37, 3)[1:]  # [1, T], shared by both rows
    o, ht = backends._run_fla(_fake_fla(), x["q"], x["k"], x["v"], x["log_a"], "scalar", None, reset, False)
    o_ref, _ = gla_reference(x["q"], x["k"], x["v"], x["log_a"], reset=reset)
    assert ht is None
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)


def test_fla_mapping_keeps_dtypes():
    x = _gla_inputs("vector", dtype=torch.bfloat16)
    x["q"] = x["q"].float()  # mixed: computed in the promoted dtype, o returned in v's dtype
    o, ht = backends._run_fla(_fake_fla(), x["q"], x["k"], x["v"], x["log_a"], "vector", x["initial_state"], None,
                              True)
    assert o.dtype == torch.bfloat16 and ht.dtype == torch.float32


def test_segments():
    reset = torch.tensor([[False, False, True, False], [True, False, False, True]])
    cu, first, last = backends._segments(reset, 2, 4)
    assert cu.tolist() == [0, 2, 4, 7, 8]
    assert first.tolist() == [0, 2] and last.tolist() == [1, 3]


def _fake_mamba():
    def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                          return_last_state=False):
        # the checks of selective_scan_cuda.fwd
        assert u.dtype in (torch.float32, torch.bfloat16, torch.float16) and A.dtype == torch.float32
        assert delta.dtype == u.dtype and B.dtype == u.dtype and C.dtype == u.dtype
        Bt, Din, L = u.shape
        N = A.shape[1]
        assert delta.shape == u.shape and A.shape == (Din, N) and B.shape == C.shape == (Bt, N, L)
        assert D is None or (D.dtype == torch.float32 and D.shape == (Din,))
        assert u.stride(-1) == 1 and delta.stride(-1) == 1
        y, last = selective_scan_reference(u.transpose(1, 2), delta.transpose(1, 2), A, B.transpose(1, 2),
                                           C.transpose(1, 2), D, dt_softplus=delta_softplus)
        y = y.transpose(1, 2)
        # "the gradient of the last state is not considered in the backward pass"
        return (y, last.detach()) if return_last_state else y

    return SimpleNamespace(selective_scan_fn=selective_scan_fn)


def _scan_inputs(Bt=2, T=45, Din=12, N=5, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(u=r(Bt, T, Din).to(dtype), dt=r(Bt, T, Din) - 1.0, A=-torch.rand(Din, N, generator=g) * 2,
                B=r(Bt, T, N).to(dtype), C=r(Bt, T, N).to(dtype), D=r(Din))


@pytest.mark.parametrize("softplus", [False, True])
@pytest.mark.parametrize("final", [False, True])
def test_mamba_mapping_matches_reference(softplus, final):
    x = _scan_inputs(seed=int(softplus) + 2 * int(final))
    if not softplus:
        x["dt"] = torch.nn.functional.softplus(x["dt"])

    def via_mamba(u, dt, A, B, C, D):
        return backends._run_mamba(_fake_mamba(), u, dt, A, B, C, D, final, softplus)

    def ref(u, dt, A, B, C, D):
        y, s = selective_scan_reference(u, dt, A, B, C, D, dt_softplus=softplus, output_final_state=final)
        return y, (None if s is None else s.detach())

    y, s, grads = _with_grads(via_mamba, x)
    y_ref, s_ref, grads_ref = _with_grads(ref, x)
    assert y.dtype == y_ref.dtype and y.shape == y_ref.shape and y.is_contiguous()
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    if final:
        assert s.dtype == torch.float32
        torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-5)
    else:
        assert s is None
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-4, atol=1e-4, msg=name)


def test_mamba_mapping_promotes_mixed_dtypes():
    """A bfloat16 u with a float32 dt (what Mamba's layer passes under autocast) runs in float32; y in u's dtype."""
    x = _scan_inputs(dtype=torch.bfloat16)
    y, s = backends._run_mamba(_fake_mamba(), *x.values(), True, True)
    y_ref, s_ref = selective_scan_reference(*x.values(), dt_softplus=True)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-5)


MODEL_CASES = [("tnl", {}), ("hgrn2", {}), ("cosformer2", {}), ("mamba", {}),
               ("mossnet", {"ssm_kernel": "ssd", "ssm_policy": "dense"}), ("deltanet", {}), ("gated_deltanet", {}),
               ("mamba2", {}), ("gla", {}), ("retnet", {}), ("mamba2", {"attn_every": 2})]


def _loss_and_grads(model, ids, reset):
    model.zero_grad()
    loss = model(ids[:, :-1], targets=ids[:, 1:], reset=reset).loss
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch, overrides", MODEL_CASES)
def test_models_through_the_dispatch_with_stand_ins(monkeypatch, arch, overrides):
    """Whole models, on the CPU but with the dispatch told that their tensors are on CUDA and the libraries replaced
    by the stand-ins above: the loss and every parameter gradient agree with LINLM_GPU_KERNELS=torch, with and
    without packed documents, and the stand-ins did run."""
    from linlm import create_model

    torch.use_deterministic_algorithms(False)  # the poisoning fixture's mode, under which the dispatch stays off
    monkeypatch.setenv("LINLM_SCAN_BACKEND", "torch")  # past the CPU kernel, on to the CUDA branch
    calls = {"fla": 0, "mamba_ssm": 0}

    def counted(ns, lib):
        def wrap(fn):
            def call(*a, **k):
                calls[lib] += 1
                return fn(*a, **k)
            return call
        return SimpleNamespace(**{name: wrap(fn) for name, fn in vars(ns).items()})

    monkeypatch.setattr(backends, "_device_type", lambda t: "cuda")
    monkeypatch.setattr(backends, "_fla", lambda: counted(_fake_fla(), "fla"))
    monkeypatch.setattr(backends, "_mamba", lambda: counted(_fake_mamba(), "mamba_ssm"))
    monkeypatch.setattr(backends, "_mamba_ssd", lambda: counted(fake_mamba_ssd(), "mamba_ssm"))
    monkeypatch.setattr(backends, "fla_gated_backward_ok", lambda index: True)
    torch.manual_seed(0)
    model = create_model(arch, "tiny", **overrides)
    ids = torch.randint(0, 512, (2, 34))
    reset = torch.zeros(2, 33, dtype=torch.bool)
    reset[0, 11] = reset[1, 20] = True
    library = "mamba_ssm" if arch in ("mamba", "mamba2") else "fla"  # Mamba-2: the SSD kernel
    for rst in (None, reset):
        calls.update(fla=0, mamba_ssm=0)
        with backends.gpu_kernels("auto"):
            loss_k, grads_k = _loss_and_grads(model, ids, rst)
        used = dict(calls)
        with backends.gpu_kernels("torch"):
            loss_t, grads_t = _loss_and_grads(model, ids, rst)
        assert calls == used, "the torch mode called a library"
        # selective_scan_fn takes no resets: the packed batch runs on linlm's scan, and the library is not called
        if arch == "mamba" and rst is not None:
            assert used[library] == 0, used
        else:
            assert used[library] > 0, used
        assert abs(loss_k - loss_t) <= 1e-5 * abs(loss_t)
        assert grads_k.keys() == grads_t.keys()
        for name, want in grads_t.items():
            torch.testing.assert_close(grads_k[name], want, rtol=1e-4, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------------------------------
# on a GPU, with the real libraries

def _needs(library):
    if not backends.available(library):
        pytest.skip(f"needs {library} (pip install 'linlm[gpu]')")


def _cuda(x, dtype=None):
    return {n: None if t is None else t.to("cuda", dtype if dtype is not None and n in ("q", "k", "v") else t.dtype)
            for n, t in x.items()}


@contextlib.contextmanager
def _counting(name):
    """Count the calls of backends.<name> (where the library is called) within the block."""
    calls = []
    real = getattr(backends, name)

    def spy(*a):
        calls.append(1)
        return real(*a)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backends, name, spy)
        yield calls


# fla runs its float32 matmuls in TF32 (Triton's default for tl.dot; 10-bit mantissa, unit roundoff 2^-11 ~ 4.9e-4):
# a few roundings deep, a relative RMS error around 1e-3. bfloat16 (unit roundoff 2^-8 ~ 3.9e-3) inputs, and fla
# rounds the chunk scores and the per-chunk states to bfloat16 before the next matmul: a few times 4e-3. Log-gate
# gradients sum many products over the sequence and lose about one more digit (fla's own tests allow them more).
FLA_TOL = {torch.float32: (5e-3, 2e-2), torch.bfloat16: (2e-2, 5e-2)}


@gpu_test
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("init", [False, True])
@pytest.mark.parametrize("with_reset", [False, True])
def test_fla_against_reference(dtype, kind, init, with_reset):
    _needs("fla")
    x = _cuda(_gla_inputs(kind, B=2, T=200, H=2, K=32, V=64, seed=7, init=init), dtype)
    reset = _reset(2, 200, 11).cuda() if with_reset else None
    with _counting("_run_fla") as calls:
        o, ht, grads = _with_grads(lambda **a: gla(**a, reset=reset), x)
        # a trained scalar or constant gate goes through chunk_simple_gla's gated backward, which fla refuses on
        # some GPU + Triton pairs (backends.fla_gated_backward_ok); linlm's path takes over there
        gated_ok = kind not in ("scalar", "head") or backends.fla_gated_backward_ok(torch.cuda.current_device())
        assert bool(calls) == gated_ok, "fla was not used" if gated_ok else "fla was used where it cannot be"
        calls.clear()
        with torch.no_grad():  # forward only: a constant gate as g_gamma
            o_nograd, ht_nograd = gla(**x, reset=reset)
        assert calls, "fla was not used"
    ref_in = {n: None if t is None else t.float() for n, t in x.items()}
    o_ref, ht_ref, grads_ref = _with_grads(lambda **a: gla_reference(**a, reset=reset), ref_in)
    tol, tol_gate = FLA_TOL[dtype]
    assert o.dtype == o_nograd.dtype == dtype and ht.dtype == ht_nograd.dtype == torch.float32
    for got, got_state in ((o, ht), (o_nograd, ht_nograd)):
        assert err_ratio(got, o_ref) < tol and err_ratio(got_state, ht_ref) < tol
    for name, want in grads_ref.items():
        assert err_ratio(grads[name], want) < (tol_gate if name == "log_a" else tol), name


@gpu_test
def test_fla_switch_forces_torch(monkeypatch):
    _needs("fla")
    x = _cuda(_gla_inputs("vector", T=64, K=32, V=32))

    def boom(*a, **k):
        raise AssertionError("fla was called")

    monkeypatch.setattr(backends, "_fla", lambda: SimpleNamespace(chunk_gla=boom, chunk_simple_gla=boom))
    with pytest.raises(AssertionError, match="fla was called"):
        gla(**x)
    monkeypatch.setenv(backends.ENV, "torch")
    o, ht = gla(**x)
    o_ref, ht_ref = gla_reference(**x)
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-4)
    monkeypatch.setenv(backends.ENV, "auto")
    with backends.gpu_kernels("torch"):
        gla(**x)


# mamba_ssm computes in float32 (no tensor cores) from inputs in their own dtype, as linlm does: float32 agrees to
# rounding; with bfloat16 u, B, C only the bfloat16 rounding of y and of the input gradients is left (2^-9 relative
# per element, an RMS ratio well under 1e-2).
MAMBA_TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


@gpu_test
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("softplus", [False, True])
def test_mamba_against_reference(dtype, softplus):
    _needs("mamba_ssm")
    x = _scan_inputs(Bt=2, T=300, Din=64, N=16, seed=3, dtype=dtype)
    if not softplus:
        x["dt"] = torch.nn.functional.softplus(x["dt"])
    x["dt"] = x["dt"].to(dtype)  # dt in u's dtype too: the kernel then reads bfloat16 (a float32 dt promotes)
    x = {n: t.cuda() for n, t in x.items()}
    with _counting("_run_mamba") as calls:
        y, _, grads = _with_grads(lambda **a: selective_scan(**a, dt_softplus=softplus, output_final_state=False), x)
        with torch.no_grad():
            _, s = selective_scan(**x, dt_softplus=softplus)
    assert len(calls) == 2, "mamba_ssm was not used"
    y_ref, _, grads_ref = _with_grads(
        lambda **a: selective_scan_reference(**a, dt_softplus=softplus, output_final_state=False), x)
    _, s_ref = selective_scan_reference(**x, dt_softplus=softplus)
    assert y.dtype == dtype and s.dtype == torch.float32
    assert err_ratio(y, y_ref) < MAMBA_TOL[dtype] and err_ratio(s, s_ref) < MAMBA_TOL[torch.float32]
    for name, want in grads_ref.items():
        assert err_ratio(grads[name], want) < MAMBA_TOL[dtype], name


@gpu_test
def test_mamba_fallbacks_stay_exact():
    """Cases mamba_ssm cannot take (initial state, resets, a final state with a gradient) run linlm's path."""
    _needs("mamba_ssm")
    x = {n: t.cuda() for n, t in _scan_inputs(T=70, Din=32, N=8).items()}
    init = torch.randn(2, 32, 8, device="cuda")
    reset = _reset(2, 70, 1).cuda()
    for kw in ({"initial_state": init}, {"reset": reset}):
        y, s = selective_scan(**x, dt_softplus=True, **kw)
        y_ref, s_ref = selective_scan_reference(**x, dt_softplus=True, **kw)
        torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-4)


@gpu_test
def test_mamba_switch_forces_torch(monkeypatch):
    _needs("mamba_ssm")
    x = {n: t.cuda() for n, t in _scan_inputs(T=64, Din=32, N=8).items()}

    def boom(*a, **k):
        raise AssertionError("mamba_ssm was called")

    monkeypatch.setattr(backends, "_mamba", lambda: SimpleNamespace(selective_scan_fn=boom))
    with pytest.raises(AssertionError, match="mamba_ssm was called"):
        selective_scan(**x, dt_softplus=True, output_final_state=False)
    monkeypatch.setenv(backends.ENV, "torch")
    y, _ = selective_scan(**x, dt_softplus=True, output_final_state=False)
    y_ref, _ = selective_scan_reference(**x, dt_softplus=True, output_final_state=False)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    monkeypatch.setenv(backends.ENV, "auto")
    with backends.gpu_kernels("torch"):
        selective_scan(**x, dt_softplus=True, output_final_state=False)


@gpu_test
@pytest.mark.parametrize("arch, overrides", MODEL_CASES)
def test_model_loss_kernels_against_torch(arch, overrides):
    """A whole model on CUDA: the loss and every gradient with the libraries' kernels (where installed) against
    LINLM_GPU_KERNELS=torch, in float32."""
    from linlm import create_model

    torch.manual_seed(0)
    model = create_model(arch, "tiny", **overrides).cuda()
    ids = torch.randint(0, 512, (2, 97), device="cuda")
    reset = torch.zeros(2, 96, dtype=torch.bool, device="cuda")
    reset[0, 40] = reset[1, 70] = True
    for rst in (None, reset):
        with backends.gpu_kernels("auto"):
            loss_k, grads_k = _loss_and_grads(model, ids, rst)
        with backends.gpu_kernels("torch"):
            loss_t, grads_t = _loss_and_grads(model, ids, rst)
        # fla's TF32 matmuls (see FLA_TOL) are the difference
        assert abs(loss_k - loss_t) < 1e-3 * abs(loss_t)
        assert grads_k.keys() == grads_t.keys()
        for name, want in grads_t.items():
            assert err_ratio(grads_k[name], want) < 2e-2, name
