"""Gated linear attention with q and k shared by groups of heads (Mamba-2's B and C): the grouped chunk form
(ops/ssd.py) and the step form agree with the sequential reference, and the reference reads the groups as the
convention says (head h reads group h // (H / G)), checked against q and k copied out head by head."""

from __future__ import annotations

import pytest
import torch

from linlm.errors import ShapeError
from linlm.ops import gla as gla_module
from linlm.ops.gla import gla, gla_chunk, gla_reference, gla_step
from test_gla import assert_all_close, run_with_grads

F64 = torch.float64


def grouped_inputs(kind, T, *, B=2, G=2, H=6, K=5, V=3, seed=0, dtype=F64, lo=-1.0, init=True):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    x = dict(q=r(B, T, G, K), k=r(B, T, G, K), v=r(B, T, H, V), log_a=None,
             initial_state=r(B, H, K, V) if init else None)
    if kind == "head":
        x["log_a"] = lo * torch.rand(H, generator=g, dtype=F64)
    elif kind == "scalar":
        x["log_a"] = lo * torch.rand(B, T, H, generator=g, dtype=F64)
    return {n: (t.to(dtype) if t is not None else None) for n, t in x.items()}


def per_head(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped [B, T, G, K] as [B, T, H, K], head by head: head h is group h // (H / G)."""
    per_group = heads // x.shape[2]
    return torch.stack([x[:, :, h // per_group] for h in range(heads)], dim=2)


def spy_grouped(monkeypatch) -> list:
    """Count the calls of the grouped chunk path."""
    calls, real = [], gla_module.chunk_grouped

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(gla_module, "chunk_grouped", counted)
    return calls


@pytest.mark.parametrize("kind", ["none", "head", "scalar"])
def test_reference_reads_each_group_for_its_heads(kind):
    x = grouped_inputs(kind, 11, G=2, H=6)
    o, s = gla_reference(**x)
    full = dict(x, q=per_head(x["q"], 6), k=per_head(x["k"], 6))
    o_full, s_full = gla_reference(**full)
    torch.testing.assert_close(o, o_full, rtol=0, atol=0)
    torch.testing.assert_close(s, s_full, rtol=0, atol=0)
    # and not some other assignment: swapping the groups changes the result
    swapped = dict(x, q=x["q"].flip(2), k=x["k"].flip(2))
    assert not torch.allclose(gla_reference(**swapped)[0], o)


@pytest.mark.parametrize("kind", ["head", "scalar"])
@pytest.mark.parametrize("G,H", [(1, 4), (2, 6), (3, 3 * 5)])
@pytest.mark.parametrize("T,chunk", [(1, 64), (63, 64), (65, 64), (100, 16), (37, 8), (20, 1)])
def test_grouped_chunk_matches_reference(kind, G, H, T, chunk, monkeypatch):
    calls = spy_grouped(monkeypatch)
    x = grouped_inputs(kind, T, G=G, H=H, seed=T + chunk + H)
    want = run_with_grads(gla_reference, x)
    got = run_with_grads(gla_chunk, x, chunk_size=chunk)
    assert calls, "the grouped path was not taken"
    assert got[2]["q"].shape == x["q"].shape and got[2]["k"].shape == x["k"].shape
    assert_all_close(got, want, rtol=1e-9, atol=1e-9, what=f"{kind} G={G} H={H} T={T} C={chunk}")


@pytest.mark.parametrize("kind", ["none", "head", "scalar"])
def test_grouped_chunk_with_resets_and_no_initial_state(kind, monkeypatch):
    """Packed documents: the grouped path with -inf resets (also for a gateless op, which then takes it)."""
    calls = spy_grouped(monkeypatch)
    T = 150
    x = grouped_inputs(kind, T, init=False, seed=7)
    g = torch.Generator().manual_seed(8)
    reset = torch.rand(2, T, generator=g) < 0.05
    reset[:, 0] = True
    reset[1, 64] = True  # on a chunk boundary
    want = run_with_grads(gla_reference, x, reset=reset)
    got = run_with_grads(gla_chunk, x, reset=reset, chunk_size=32)
    assert calls
    assert_all_close(got, want, rtol=1e-9, atol=1e-9, what=kind)


def test_grouped_gate_without_grad():
    x = grouped_inputs("scalar", 45, seed=4)
    la = x.pop("log_a")

    def fixed(fn, **kw):
        return lambda q, k, v, _la, **kw2: fn(q, k, v, la, **kw, **kw2)

    want = run_with_grads(fixed(gla_reference), dict(x, log_a=None))
    got = run_with_grads(fixed(gla_chunk, chunk_size=16), dict(x, log_a=None))
    assert_all_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("lo", [-20.0, -200.0])
def test_strong_gates_float32_against_float64(lo):
    """Log-gates down to ``lo`` per step: finite in float32 and within float32 rounding of float64."""
    x64 = grouped_inputs("scalar", 130, seed=9, lo=lo)
    x32 = {n: (t.float() if t is not None else None) for n, t in x64.items()}
    want = run_with_grads(gla_reference, x64)
    got = run_with_grads(gla_chunk, x32, chunk_size=64)
    for t in (got[0], got[1], *got[2].values()):
        assert torch.isfinite(t).all()
    assert_all_close(got, want, rtol=1e-4, atol=1e-4, what=f"lo={lo}")


def test_vector_gate_with_grouped_qk_takes_the_per_head_path(monkeypatch):
    calls = spy_grouped(monkeypatch)
    x = grouped_inputs("none", 40, seed=10)
    g = torch.Generator().manual_seed(11)
    x["log_a"] = -torch.rand(2, 40, 6, 5, generator=g, dtype=F64)
    want = run_with_grads(gla_reference, x)
    got = run_with_grads(gla_chunk, x, chunk_size=16)
    assert not calls
    assert_all_close(got, want, rtol=1e-9, atol=1e-9)


def test_dispatcher_and_steps_take_grouped_qk():
    """gla() on the CPU is the chunk form; steps from a chunked prefill continue it exactly."""
    T, P = 61, 45
    x = grouped_inputs("scalar", T, seed=12, dtype=torch.float32)
    o_full, s_full = gla(**x, chunk_size=16)
    o_ref, s_ref = gla_chunk(**x, chunk_size=16)
    torch.testing.assert_close(o_full, o_ref, rtol=0, atol=0)
    head = dict(x, q=x["q"][:, :P], k=x["k"][:, :P], v=x["v"][:, :P], log_a=x["log_a"][:, :P])
    outs, (o_pre, state) = [], gla_chunk(**head, chunk_size=16)
    outs.append(o_pre)
    for t in range(P, T):
        o, state = gla_step(x["q"][:, t], x["k"][:, t], x["v"][:, t], x["log_a"][:, t], state=state)
        outs.append(o[:, None])
    torch.testing.assert_close(torch.cat(outs, 1), o_full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, s_full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [gla_chunk, gla_reference])
def test_heads_not_a_multiple_of_the_groups_raise(fn):
    x = grouped_inputs("scalar", 8, G=4, H=6)
    with pytest.raises(ShapeError, match=r"multiple of q's 4 heads"):
        fn(**x)


def test_step_heads_not_a_multiple_of_the_groups_raise():
    x = grouped_inputs("scalar", 1, G=4, H=6)
    with pytest.raises(ShapeError, match=r"multiple of q's 4 heads"):
        gla_step(x["q"][:, 0], x["k"][:, 0], x["v"][:, 0], x["log_a"][:, 0])


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("trained", [False, True])
def test_a_fixed_gate_spares_the_state_pass_its_decay_gradient(grouped, trained, monkeypatch):
    """With a gate that needs no gradient (RetNet's and TNL's fixed decays) while q, k and v do, the decay reaches
    the pass over chunks without requiring a gradient, so its backward skips that work; a trained gate's does."""
    from linlm.ops import chunks, ssd

    seen = []

    class Recording:
        @staticmethod
        def apply(local, decay, s0):
            seen.append(decay.requires_grad)
            return chunks.StateScan.apply(local, decay, s0)

    monkeypatch.setattr(gla_module, "StateScan", Recording)
    monkeypatch.setattr(ssd, "StateScan", Recording)
    x = grouped_inputs("head", 40, G=2 if grouped else 6, H=6, seed=13)
    x["log_a"].requires_grad_(trained)
    leaves = [x[n].requires_grad_(True) for n in ("q", "k", "v")]
    o, s = gla_chunk(**x, chunk_size=16)
    (o.sum() + s.sum()).backward()
    assert seen == [trained]
    assert all(t.grad is not None for t in leaves)
    assert (x["log_a"].grad is not None) == trained
