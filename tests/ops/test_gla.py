"""Gated linear attention: the chunk and step forms agree with the sequential reference.

Outputs, final states and every gradient (q, k, v, log_a, initial_state), for every gate kind, at awkward
lengths and chunk sizes, with packed documents, with log-gates down to -20 per step (and below), in float64
(tight) and float32 against a float64 reference. Sizes are asymmetric (K=16 != V=24, B != H) so that a
transposed index shows up. Buffers from torch.empty are NaN-filled (deterministic mode), and NaN never passes.
"""

from __future__ import annotations

import pytest
import torch

from linlm.errors import ConfigError, ShapeError
from linlm.ops.gla import gla, gla_chunk, gla_reference, gla_step, reset_from_cu_seqlens

F64 = torch.float64
KINDS = ("none", "head", "scalar", "vector")
B, H, K, V = 2, 3, 16, 24


def gate_shape(kind, B, T, H, K):
    return {"none": None, "head": (H,), "scalar": (B, T, H), "vector": (B, T, H, K)}[kind]


def make_inputs(kind, T, *, Bn=B, Hn=H, Kn=K, Vn=V, seed=0, dtype=F64, lo=-1.0, init=True):
    """q, k, v, log_a (uniform in [lo, 0]) and an initial state, float64 unless asked otherwise."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    x = dict(q=r(Bn, T, Hn, Kn), k=r(Bn, T, Hn, Kn), v=r(Bn, T, Hn, Vn), log_a=None,
             initial_state=r(Bn, Hn, Kn, Vn) if init else None)
    shape = gate_shape(kind, Bn, T, Hn, Kn)
    if shape is not None:
        x["log_a"] = lo * torch.rand(*shape, generator=g, dtype=F64)
    return {n: (t.to(dtype) if t is not None else None) for n, t in x.items()}


def run_with_grads(fn, inputs, *, seed=1, **kw):
    """fn on fresh leaves; backprop random cotangents of o and the final state. Returns (o, state, grads)."""
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in inputs.items() if t is not None}
    args = {n: leaves.get(n) for n in inputs}
    o, s = fn(args["q"], args["k"], args["v"], args["log_a"], initial_state=args["initial_state"], **kw)
    g = torch.Generator().manual_seed(seed)
    loss = (o.double() * torch.randn(o.shape, generator=g, dtype=F64)).sum()
    loss = loss + (s.double() * torch.randn(s.shape, generator=g, dtype=F64)).sum()
    loss.backward()
    return o.detach(), s.detach(), {n: t.grad for n, t in leaves.items()}


def assert_all_close(got, want, *, rtol, atol, what=""):
    o1, s1, g1 = got
    o2, s2, g2 = want
    torch.testing.assert_close(o1.double(), o2.double(), rtol=rtol, atol=atol, msg=lambda m: f"{what} o: {m}")
    torch.testing.assert_close(s1.double(), s2.double(), rtol=rtol, atol=atol, msg=lambda m: f"{what} state: {m}")
    assert g1.keys() == g2.keys()
    for n in g1:
        assert g1[n] is not None and g2[n] is not None, f"{what}: no gradient for {n}"
        torch.testing.assert_close(g1[n].double(), g2[n].double(), rtol=rtol, atol=atol,
                                   msg=lambda m, n=n: f"{what} d{n}: {m}")


# ------------------------------------------------------------------------------------------------------------
# The reference is the definition: check it once against a brute-force sum written a different way.
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_reference_is_the_recurrence(kind):
    """o_t = sum_{s<=t} (q_t * prod_{s<u<=t} a_u) . k_s v_s + (q_t * prod_{u<=t} a_u)^T S_0, summed explicitly."""
    T = 9
    x = make_inputs(kind, T)
    o, s = gla_reference(**x)
    la = x["log_a"]
    if la is None:
        la = torch.zeros(B, T, H, K, dtype=F64)
    elif la.dim() == 1:
        la = la.view(1, 1, H, 1).expand(B, T, H, K)
    elif la.dim() == 3:
        la = la.unsqueeze(-1).expand(B, T, H, K)
    want = torch.zeros(B, T, H, V, dtype=F64)
    for t in range(T):
        for s_ in range(t + 1):
            decay = la[:, s_ + 1 : t + 1].sum(1).exp()  # [B, H, K]
            score = (x["q"][:, t] * decay * x["k"][:, s_]).sum(-1)  # [B, H]
            want[:, t] += score.unsqueeze(-1) * x["v"][:, s_]
        decay0 = la[:, : t + 1].sum(1).exp()
        want[:, t] += torch.einsum("bhk,bhkv->bhv", x["q"][:, t] * decay0, x["initial_state"])
    torch.testing.assert_close(o, want, rtol=1e-12, atol=1e-12)
    s_want = torch.einsum("bhk,bhkv->bhkv", la.sum(1).exp(), x["initial_state"])
    for s_ in range(T):
        decay = la[:, s_ + 1 :].sum(1).exp()
        s_want += torch.einsum("bhk,bhv->bhkv", x["k"][:, s_] * decay, x["v"][:, s_])
    torch.testing.assert_close(s, s_want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------------------
# Chunk form against the reference
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("T,chunk", [(1, 64), (63, 64), (500, 64), (100, 16), (130, 128), (77, 48), (20, 1)])
def test_chunk_matches_reference(kind, T, chunk):
    x = make_inputs(kind, T, seed=T + chunk)
    want = run_with_grads(gla_reference, x)
    got = run_with_grads(gla_chunk, x, chunk_size=chunk)
    assert_all_close(got, want, rtol=1e-9, atol=1e-9, what=f"{kind} T={T} C={chunk}")


@pytest.mark.parametrize("kind", KINDS)
def test_chunk_without_initial_state_and_without_final_state(kind):
    x = make_inputs(kind, 70, init=False)
    want = run_with_grads(gla_reference, x)
    got = run_with_grads(gla_chunk, x, chunk_size=32)
    assert_all_close(got, want, rtol=1e-9, atol=1e-9, what=kind)
    o, s = gla_chunk(x["q"], x["k"], x["v"], x["log_a"], output_final_state=False, chunk_size=32)
    assert s is None
    torch.testing.assert_close(o, want[0], rtol=1e-9, atol=1e-9)
    o_ref, s_ref = gla_reference(x["q"], x["k"], x["v"], x["log_a"], output_final_state=False)
    assert s_ref is None


@pytest.mark.parametrize("kind", ["head", "scalar", "vector"])
def test_gate_without_grad(kind):
    """A gate that does not require grad (a fixed decay): q, k, v and initial-state gradients still match."""
    x = make_inputs(kind, 45, seed=4)
    la = x.pop("log_a")

    def with_fixed_gate(fn, **kw):
        return lambda q, k, v, _la, **kw2: fn(q, k, v, la, **kw, **kw2)

    want = run_with_grads(with_fixed_gate(gla_reference), dict(x, log_a=None))
    got = run_with_grads(with_fixed_gate(gla_chunk, chunk_size=16), dict(x, log_a=None))
    assert_all_close(got, want, rtol=1e-9, atol=1e-9, what=kind)


@pytest.mark.parametrize("kind", KINDS)
def test_random_resets_match_reference(kind):
    T = 150
    x = make_inputs(kind, T, seed=5)
    g = torch.Generator().manual_seed(6)
    reset = torch.rand(B, T, generator=g) < 0.04
    reset[0, 64] = True  # on a chunk boundary
    reset[1, 0] = True  # at the start: discards the initial state
    want = run_with_grads(gla_reference, x, reset=reset)
    got = run_with_grads(gla_chunk, x, reset=reset, chunk_size=32)
    assert_all_close(got, want, rtol=1e-9, atol=1e-9, what=kind)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fn", [gla_reference, gla_chunk], ids=["reference", "chunk"])
def test_packed_row_equals_documents_one_by_one(kind, fn):
    """One packed row with resets == each document run alone (outputs, last state and gradients)."""
    lengths = [5, 70, 1, 40, 33]
    T = sum(lengths)
    x = make_inputs(kind, T, Bn=1, seed=7, init=False)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    reset = reset_from_cu_seqlens(cu, T)
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items() if t is not None}
    g = torch.Generator().manual_seed(8)
    w = torch.randn(1, T, H, V, generator=g, dtype=F64)
    w_s = torch.randn(1, H, K, V, generator=g, dtype=F64)

    kw = dict(chunk_size=16) if fn is gla_chunk else {}
    la = leaves.get("log_a")

    def call(sl):
        la_d = la[:, sl] if la is not None and la.dim() > 1 else la
        return fn(leaves["q"][:, sl], leaves["k"][:, sl], leaves["v"][:, sl], la_d, **kw)

    o_p, s_p = fn(leaves["q"], leaves["k"], leaves["v"], la, reset=reset, **kw)
    grads_p = torch.autograd.grad((o_p * w).sum() + (s_p * w_s).sum(), list(leaves.values()))

    outs, loss = [], 0.0
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        o_d, s_d = call(slice(a, b))
        outs.append(o_d)
        loss = loss + (o_d * w[:, a:b]).sum()
    loss = loss + (s_d * w_s).sum()
    grads_d = torch.autograd.grad(loss, list(leaves.values()))

    torch.testing.assert_close(o_p, torch.cat(outs, 1), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_p, s_d, rtol=1e-10, atol=1e-10)
    for name, gp, gd in zip(leaves, grads_p, grads_d):
        torch.testing.assert_close(gp, gd, rtol=1e-10, atol=1e-10, msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize("kind", KINDS)
def test_initial_state_applies_only_before_the_first_reset(kind):
    T = 40
    x = make_inputs(kind, T, seed=9)
    reset = torch.zeros(B, T, dtype=torch.bool)
    reset[:, 25] = True
    o, s = gla_chunk(**x, reset=reset, chunk_size=16)
    x0 = dict(x, initial_state=None)
    o0, s0 = gla_chunk(**x0, reset=reset, chunk_size=16)
    assert (o[:, :25] - o0[:, :25]).abs().max() > 1e-3  # the initial state is seen before the reset...
    torch.testing.assert_close(o[:, 25:], o0[:, 25:], rtol=0, atol=0)  # ...and not at all after it
    torch.testing.assert_close(s, s0, rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fn", [gla_reference, gla_chunk], ids=["reference", "chunk"])
def test_reset_leaks_exactly_nothing(kind, fn):
    """After a reset, nothing of the past survives, not even 1e-38 of it: with k = v = 0 from the reset on, the
    outputs, the final state and the gradient reaching the (huge) initial state from those outputs are exactly 0."""
    T, r = 40, 25
    x = make_inputs(kind, T, seed=21)
    x["initial_state"] = x["initial_state"] * 1e30
    x["k"][:, r:] = 0.0
    x["v"][:, r:] = 0.0
    reset = torch.zeros(B, T, dtype=torch.bool)
    reset[0, r] = True
    reset[1, 32] = True  # on a chunk boundary (chunk 16)
    reset[1, r] = True
    s0 = x.pop("initial_state").requires_grad_(True)
    kw = dict(chunk_size=16) if fn is gla_chunk else {}
    o, s = fn(**x, initial_state=s0, reset=reset, **kw)
    assert o[:, :r].abs().max() > 1e20  # the initial state is seen before the reset
    assert torch.equal(o[:, r:], torch.zeros_like(o[:, r:]))
    assert torch.equal(s, torch.zeros_like(s))
    (g,) = torch.autograd.grad(o[:, r:].sum() + s.sum(), s0)
    assert torch.equal(g, torch.zeros_like(g))


# ------------------------------------------------------------------------------------------------------------
# Stability: strongly negative log-gates, float32 against a float64 reference
# ------------------------------------------------------------------------------------------------------------


def strong_gates(kind, T, seed):
    """log a in [-20, 0]: uniform, with runs of mild gates and a few far below -20 (down to -300)."""
    x = make_inputs(kind, T, seed=seed, lo=-20.0)
    la = x["log_a"]
    if la is not None and la.dim() > 1:
        g = torch.Generator().manual_seed(seed + 1)
        mild = torch.rand(la.shape, generator=g, dtype=F64) < 0.6
        la = torch.where(mild, la * 0.01, la)
        deep = torch.rand(la.shape, generator=g, dtype=F64) < 0.02
        x["log_a"] = torch.where(deep, -300.0 * torch.rand(la.shape, generator=g, dtype=F64), la)
    return x


@pytest.mark.parametrize("kind", ["head", "scalar", "vector"])
@pytest.mark.parametrize("chunk", [16, 64, 128])
def test_strong_gates_float32_against_float64(kind, chunk):
    T = 200
    x = strong_gates(kind, T, seed=chunk)
    g = torch.Generator().manual_seed(chunk)
    reset = torch.rand(B, T, generator=g) < 0.03
    want = run_with_grads(gla_reference, x, reset=reset)
    x32 = {n: (t.float() if t is not None else None) for n, t in x.items()}
    got = run_with_grads(gla_chunk, x32, reset=reset, chunk_size=chunk)
    o, s, grads = got
    assert o.dtype == torch.float32 and s.dtype == torch.float32
    for t in (o, s, *grads.values()):
        assert torch.isfinite(t).all()
    # float32 rounding only: errors relative to each tensor's largest entry
    for a, b, name in [(o, want[0], "o"), (s, want[1], "state")] + [
        (grads[n], want[2][n], "d" + n) for n in grads
    ]:
        scale = b.abs().max().item()
        err = (a.double() - b).abs().max().item()
        assert err <= 2e-6 * scale, f"{kind} C={chunk} {name}: max error {err:.3g} vs scale {scale:.3g}"


def test_extreme_gates_stay_finite_in_float32():
    """Gates far beyond -20 (down to -1e4) everywhere: every output and gradient finite, matching float64."""
    T = 96
    for kind in ("scalar", "vector"):
        x = make_inputs(kind, T, seed=3, lo=-1e4)
        want = run_with_grads(gla_reference, x)
        x32 = {n: (t.float() if t is not None else None) for n, t in x.items()}
        o, s, grads = run_with_grads(gla_chunk, x32, chunk_size=64)
        for t in (o, s, *grads.values()):
            assert torch.isfinite(t).all()
        torch.testing.assert_close(o.double(), want[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(s.double(), want[1], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------------------
# Step form
# ------------------------------------------------------------------------------------------------------------


def step_gate(log_a, t):
    if log_a is None or log_a.dim() == 1:
        return log_a
    return log_a[:, t]


@pytest.mark.parametrize("kind", KINDS)
def test_step_iterated_equals_reference(kind):
    T = 37
    x = make_inputs(kind, T, seed=11)
    want = run_with_grads(gla_reference, x)

    def stepped(q, k, v, log_a, *, initial_state):
        state, outs = initial_state, []
        for t in range(q.shape[1]):
            o, state = gla_step(q[:, t], k[:, t], v[:, t], step_gate(log_a, t), state=state)
            outs.append(o)
        return torch.stack(outs, 1), state

    got = run_with_grads(stepped, x)
    assert_all_close(got, want, rtol=1e-12, atol=1e-12, what=kind)


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_with_chunks_then_decode_with_steps(kind):
    """Chunk form over a prompt, then steps from its final state == the chunk form over everything."""
    T, P = 61, 45
    x = make_inputs(kind, T, seed=12, dtype=torch.float32)
    o_full, s_full = gla_chunk(**x, chunk_size=16)
    head = {n: (t[:, :P] if t is not None and t.dim() > 1 and n != "initial_state" else t) for n, t in x.items()}
    o_pre, state = gla_chunk(**head, chunk_size=16)
    outs = [o_pre]
    for t in range(P, T):
        o, state = gla_step(x["q"][:, t], x["k"][:, t], x["v"][:, t], step_gate(x["log_a"], t), state=state)
        outs.append(o[:, None])
    torch.testing.assert_close(torch.cat(outs, 1), o_full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, s_full, rtol=1e-5, atol=1e-5)


def test_step_without_state_starts_from_zero():
    x = make_inputs("vector", 1, seed=13, init=False)
    o, s = gla_step(x["q"][:, 0], x["k"][:, 0], x["v"][:, 0], x["log_a"][:, 0])
    o_ref, s_ref = gla_reference(**x)
    torch.testing.assert_close(o, o_ref[:, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------------------
# dtypes, layouts, aliasing
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_inputs_accumulate_in_float32(kind):
    T = 90
    x32 = make_inputs(kind, T, seed=14, dtype=torch.float32, lo=-0.5)
    xb = {n: (t.bfloat16() if t is not None else None) for n, t in x32.items()}
    # the float32 result on the very same (rounded) values: only accumulation may differ
    xr = {n: (t.float() if t is not None else None) for n, t in xb.items()}
    o_ref, s_ref = gla_reference(**xr)
    leaves = {n: t.clone().requires_grad_(True) for n, t in xb.items() if t is not None}
    o, s = gla_chunk(**{n: leaves.get(n) for n in xb}, chunk_size=32)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    torch.testing.assert_close(o.float(), o_ref, rtol=1e-2, atol=2e-2)  # bf16 rounding of o only
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-4)  # the state never went through bf16
    (o.float().sum() + s.sum()).backward()
    for n, t in leaves.items():
        assert t.grad.dtype == torch.bfloat16 and torch.isfinite(t.grad.float()).all(), n
    o_s, s_s = gla_step(xb["q"][:, 0], xb["k"][:, 0], xb["v"][:, 0], step_gate(xb["log_a"], 0))
    assert o_s.dtype == torch.bfloat16 and s_s.dtype == torch.float32


@pytest.mark.parametrize("kind", KINDS)
def test_non_contiguous_inputs_and_no_input_mutation(kind):
    T = 40
    x = make_inputs(kind, T, Bn=1, Hn=1, seed=15, dtype=torch.float32)  # B = H = 1: chunk layout == input layout
    before = {n: t.clone() for n, t in x.items() if t is not None}
    o, s = gla_chunk(**x, chunk_size=8)
    for n, t in before.items():
        assert torch.equal(x[n], t), f"{n} was modified in place"
    # the same values through non-contiguous views (as from .unbind of a fused projection)
    wide = torch.stack([x["q"], x["k"]], dim=2)  # [B, T, 2, H, K]
    q_nc, k_nc = wide.unbind(2)
    assert not q_nc.is_contiguous()
    o2, s2 = gla_chunk(q_nc, k_nc, x["v"], x["log_a"], initial_state=x["initial_state"], chunk_size=8)
    torch.testing.assert_close(o2, o, rtol=0, atol=0)
    torch.testing.assert_close(s2, s, rtol=0, atol=0)


def test_dispatcher_is_the_chunk_form():
    x = make_inputs("vector", 50, seed=16)
    o1, s1 = gla(**x, chunk_size=16)
    o2, s2 = gla_chunk(**x, chunk_size=16)
    torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    torch.testing.assert_close(s1, s2, rtol=0, atol=0)


def test_empty_sequence():
    x = make_inputs("scalar", 0, seed=17)
    o, s = gla_chunk(**x)
    assert o.shape == (B, 0, H, V)
    torch.testing.assert_close(s, x["initial_state"])
    o_r, s_r = gla_reference(**x)
    assert o_r.shape == (B, 0, H, V)
    torch.testing.assert_close(s_r, x["initial_state"])


# ------------------------------------------------------------------------------------------------------------
# cu_seqlens and bad input
# ------------------------------------------------------------------------------------------------------------


def test_reset_from_cu_seqlens():
    r = reset_from_cu_seqlens(torch.tensor([0, 3, 3, 7, 10], dtype=torch.int32), 10)
    assert r.shape == (1, 10) and r.dtype == torch.bool
    assert r[0].nonzero().flatten().tolist() == [0, 3, 7]
    assert reset_from_cu_seqlens([0, 4], 4)[0].tolist() == [True, False, False, False]


@pytest.mark.parametrize("cu,total,needle", [
    ([1, 4], 4, "start at 0"),
    ([0, 3], 4, "total_len=4"),
    ([0, 3, 2, 4], 4, "non-decreasing"),
    ([0.0, 4.0], 4, "integer"),
    ([[0, 4]], 4, "1-D"),
    ([0], 0, "at least 2"),
])
def test_bad_cu_seqlens(cu, total, needle):
    with pytest.raises(ShapeError, match=needle):
        reset_from_cu_seqlens(torch.tensor(cu), total)


def _seq(T=10, **over):
    x = make_inputs("vector", T, seed=18, dtype=torch.float32)
    x.update(over)
    return x


@pytest.mark.parametrize("fn", [gla_chunk, gla_reference], ids=["chunk", "reference"])
@pytest.mark.parametrize("over,needle", [
    (dict(q=torch.zeros(B, 10, H)), r"q must be 4-D"),
    (dict(k=torch.zeros(B, 10, H, K + 1)), r"k has shape \(2, 10, 3, 17\)"),
    (dict(v=torch.zeros(B, 9, H, V)), r"v has shape \(2, 9, 3, 24\)"),
    (dict(log_a=torch.zeros(B, 10)), r"log_a has shape \(2, 10\)"),
    (dict(log_a=torch.zeros(H + 1)), r"log_a has shape \(4,\)"),
    (dict(log_a=torch.zeros(B, 10, H, V)), r"log_a has shape \(2, 10, 3, 24\)"),
    (dict(initial_state=torch.zeros(B, H, V, K)), r"initial_state has shape \(2, 3, 24, 16\)"),
    (dict(q=torch.zeros(B, 10, H, K, dtype=torch.long)), r"q must be a floating-point"),
])
def test_bad_shapes_raise(fn, over, needle):
    with pytest.raises(ShapeError, match=needle):
        fn(**_seq(**over))


@pytest.mark.parametrize("reset,needle", [
    (torch.zeros(B, 10), "bool"),
    (torch.zeros(B, 11, dtype=torch.bool), r"reset has shape \(2, 11\)"),
    (torch.zeros(3, 10, dtype=torch.bool), r"reset has shape \(3, 10\)"),
])
def test_bad_reset_raises(reset, needle):
    with pytest.raises(ShapeError, match=needle):
        gla_chunk(**_seq(), reset=reset)


@pytest.mark.parametrize("chunk", [0, -4, 2.5, True])
def test_bad_chunk_size_raises(chunk):
    with pytest.raises(ConfigError, match="chunk_size"):
        gla_chunk(**_seq(), chunk_size=chunk)


@pytest.mark.parametrize("over,needle", [
    (dict(q=torch.zeros(B, 1, H, K)), r"q must be 3-D"),
    (dict(v=torch.zeros(B + 1, H, V)), r"v has shape \(3, 3, 24\)"),
    (dict(log_a=torch.zeros(B, 1, H)), r"log_a has shape \(2, 1, 3\)"),
    (dict(state=torch.zeros(B, H, K, V + 1)), r"state has shape \(2, 3, 16, 25\)"),
])
def test_step_bad_shapes_raise(over, needle):
    g = torch.Generator().manual_seed(19)
    args = dict(q=torch.randn(B, H, K, generator=g), k=torch.randn(B, H, K, generator=g),
                v=torch.randn(B, H, V, generator=g), log_a=None, state=None)
    args.update(over)
    with pytest.raises(ShapeError, match=needle):
        gla_step(args["q"], args["k"], args["v"], args["log_a"], state=args["state"])


@pytest.mark.parametrize("kind", ["head", "scalar", "vector"])
def test_step_accepts_each_gate_shape(kind):
    g = torch.Generator().manual_seed(20)
    shape = {"head": (H,), "scalar": (B, H), "vector": (B, H, K)}[kind]
    la = -torch.rand(*shape, generator=g)
    S = torch.randn(B, H, K, V, generator=g)
    q, k, v = torch.randn(B, H, K, generator=g), torch.randn(B, H, K, generator=g), torch.randn(B, H, V, generator=g)
    o, S1 = gla_step(q, k, v, la, state=S)
    a = la.exp()
    a = a.view(1, H, 1, 1) if kind == "head" else (a[..., None, None] if kind == "scalar" else a[..., None])
    S_want = a * S + k[..., :, None] * v[..., None, :]
    torch.testing.assert_close(S1, S_want)
    torch.testing.assert_close(o, torch.einsum("bhk,bhkv->bhv", q, S_want))
