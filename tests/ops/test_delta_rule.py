"""The delta rule: the chunk and step forms agree with the sequential reference, which agrees with the definition.

Outputs, final states and every gradient (q, k, v, beta, log_a, initial_state), ungated (DeltaNet) and gated (Gated
DeltaNet), with and without beta, at awkward lengths (1, 63, chunk + 1, 500) and chunk sizes, with packed
documents, with gates near 0 and near 1, in float64 (tight) and float32 against a float64 reference. Sizes are
asymmetric (K=16 != V=24, B != H) so that a transposed index shows up. Buffers from torch.empty are NaN-filled
(deterministic mode, tests/ops/conftest.py), and NaN never passes.
"""

from __future__ import annotations

import pytest
import torch

from linlm.errors import ConfigError, ShapeError
from linlm.ops.delta_chunk import unit_lower_inverse
from linlm.ops.delta_rule import delta_rule, delta_rule_chunk, delta_rule_reference, delta_rule_step
from linlm.ops.gla import reset_from_cu_seqlens

F64 = torch.float64
B, H, K, V = 2, 3, 16, 24
# (beta given, gate given): DeltaNet without and with beta, Gated DeltaNet without and with beta
KINDS = [(False, False), (True, False), (False, True), (True, True)]
IDS = ["plain", "beta", "gate", "beta+gate"]
NAMES = ("q", "k", "v", "beta", "log_a", "initial_state")


def unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def make_inputs(kind, T, *, Bn=B, Hn=H, Kn=K, Vn=V, seed=0, dtype=F64, lo=-1.0, init=True):
    """q, k (unit rows), v, beta in (0, 2), log_a uniform in [lo, 0] and an initial state, float64 by default."""
    with_beta, with_gate = kind
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    x = dict(q=r(Bn, T, Hn, Kn), k=unit(r(Bn, T, Hn, Kn)), v=r(Bn, T, Hn, Vn),
             beta=2 * torch.rand(Bn, T, Hn, generator=g, dtype=F64) if with_beta else None,
             log_a=lo * torch.rand(Bn, T, Hn, generator=g, dtype=F64) if with_gate else None,
             initial_state=r(Bn, Hn, Kn, Vn) if init else None)
    return {n: (t.to(dtype) if t is not None else None) for n, t in x.items()}


def call(fn, x, **kw):
    return fn(x["q"], x["k"], x["v"], x["beta"], x["log_a"], initial_state=x["initial_state"], **kw)


def run_with_grads(fn, inputs, *, seed=1, **kw):
    """fn on fresh leaves; backprop random cotangents of o and the final state. Returns (o, state, grads)."""
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in inputs.items() if t is not None}
    o, s = call(fn, {n: leaves.get(n) for n in NAMES}, **kw)
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
# The reference is the definition: products of the K x K transition matrices, written out.
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_reference_is_the_product_of_transitions(kind):
    """S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T with the K x K matrix formed, o_t = S_t^T q_t."""
    T = 9
    x = make_inputs(kind, T)
    o, s = call(delta_rule_reference, x)
    b = x["beta"] if x["beta"] is not None else torch.ones(B, T, H, dtype=F64)
    a = x["log_a"].exp() if x["log_a"] is not None else torch.ones(B, T, H, dtype=F64)
    eye = torch.eye(K, dtype=F64)
    S = x["initial_state"].clone()
    for t in range(T):
        kt, vt = x["k"][:, t], x["v"][:, t]
        trans = a[:, t, :, None, None] * (eye - b[:, t, :, None, None] * kt[..., :, None] * kt[..., None, :])
        S = trans @ S + b[:, t, :, None, None] * kt[..., :, None] * vt[..., None, :]
        torch.testing.assert_close(o[:, t], torch.einsum("bhkv,bhk->bhv", S, x["q"][:, t]), rtol=1e-12,
                                   atol=1e-12)
    torch.testing.assert_close(s, S, rtol=1e-12, atol=1e-12)


def test_delta_rule_overwrites_what_a_key_recalls():
    """The rule's point: with b = 1 and a unit key, writing v under k replaces what k recalled (linear attention
    would add to it). Writing v1 then v2 under the same key leaves S^T k = v2."""
    k = unit(torch.randn(1, 2, 1, K, dtype=F64)[:, :1]).expand(1, 2, 1, K)
    v = torch.randn(1, 2, 1, V, dtype=F64)
    o, s = delta_rule_reference(k, k, v, torch.ones(1, 2, 1, dtype=F64))
    torch.testing.assert_close(o[0, 1, 0], v[0, 1, 0], rtol=1e-12, atol=1e-12)
    assert (o[0, 1, 0] - v[0, 0, 0] - v[0, 1, 0]).abs().max() > 0.1


def test_unit_lower_inverse():
    g = torch.Generator().manual_seed(3)
    for C in (1, 2, 8, 64):
        # as the delta rule makes them: b_t k_t . k_s with unit keys and b in (0, 2) (a random Gaussian triangular
        # matrix would be ill-conditioned at C = 64, its inverse's entries growing exponentially)
        k = unit(torch.randn(5, C, K, generator=g, dtype=F64))
        A = 2 * torch.rand(5, C, 1, generator=g, dtype=F64) * (k @ k.mT) + torch.randn(5, C, C, generator=g).triu()
        T = unit_lower_inverse(A)
        eye = torch.eye(C, dtype=F64)
        torch.testing.assert_close(T @ (eye + A.tril(-1)), eye.expand(5, C, C), rtol=1e-10, atol=1e-10)
        assert torch.equal(T.triu(1), torch.zeros_like(T))  # reads only the strictly lower triangle
    A = torch.randn(3, 8, 8, generator=g, dtype=F64).tril(-1).requires_grad_(True)
    from linlm.ops.delta_chunk import _UnitLowerInverse

    assert torch.autograd.gradcheck(lambda a: _UnitLowerInverse.apply(a.tril(-1)), (A,))


# ------------------------------------------------------------------------------------------------------------
# Chunk form against the reference
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
@pytest.mark.parametrize("T,chunk", [(1, 64), (63, 64), (65, 64), (500, 64), (100, 16), (77, 48), (20, 1)])
def test_chunk_matches_reference(kind, T, chunk):
    x = make_inputs(kind, T, seed=T + chunk)
    want = run_with_grads(delta_rule_reference, x)
    got = run_with_grads(delta_rule_chunk, x, chunk_size=chunk)
    assert_all_close(got, want, rtol=1e-9, atol=1e-9, what=f"{IDS[KINDS.index(kind)]} T={T} C={chunk}")


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_chunk_size_does_not_change_the_result(kind):
    x = make_inputs(kind, 150, seed=2)
    runs = [run_with_grads(delta_rule_chunk, x, chunk_size=c) for c in (2, 8, 32, 64, 256)]
    for c, got in zip((8, 32, 64, 256), runs[1:]):
        assert_all_close(got, runs[0], rtol=1e-10, atol=1e-10, what=f"chunk {c} vs 2")


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_three_forms_agree_in_float32(kind):
    """Reference, chunk and the step iterated: outputs, final states and every gradient, float32."""
    x = make_inputs(kind, 70, seed=4, dtype=torch.float32)

    def stepped(q, k, v, beta, log_a, *, initial_state):
        state, outs = initial_state, []
        for t in range(q.shape[1]):
            o, state = delta_rule_step(q[:, t], k[:, t], v[:, t], None if beta is None else beta[:, t],
                                       None if log_a is None else log_a[:, t], state=state)
            outs.append(o)
        return torch.stack(outs, 1), state

    ref = run_with_grads(delta_rule_reference, x)
    assert_all_close(run_with_grads(delta_rule_chunk, x, chunk_size=16), ref, rtol=1e-4, atol=1e-4, what="chunk")
    assert_all_close(run_with_grads(stepped, x), ref, rtol=1e-5, atol=1e-5, what="step")


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_without_initial_state_and_without_final_state(kind):
    x = make_inputs(kind, 70, init=False)
    want = run_with_grads(delta_rule_reference, x)
    got = run_with_grads(delta_rule_chunk, x, chunk_size=32)
    assert_all_close(got, want, rtol=1e-9, atol=1e-9)
    o, s = call(delta_rule_chunk, x, output_final_state=False, chunk_size=32)
    assert s is None
    torch.testing.assert_close(o, want[0], rtol=1e-9, atol=1e-9)
    assert call(delta_rule_reference, x, output_final_state=False)[1] is None


def test_normalisation_and_scale():
    """qk_l2norm divides q and k by sqrt(|x|^2 + 1e-6) (fla's l2norm), scale then multiplies q; gradients flow
    through both, in every form."""
    x = make_inputs((True, True), 40, seed=5)
    g = torch.Generator().manual_seed(6)
    x["k"] = x["k"] * (1 + 3 * torch.rand(x["k"].shape[:-1], generator=g, dtype=F64)).unsqueeze(-1)
    x["q"] = 5 * x["q"]
    norm = lambda t: t / (t.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()  # noqa: E731
    by_hand = dict(x, q=0.3 * norm(x["q"]), k=norm(x["k"]))
    want = call(delta_rule_reference, by_hand)
    for fn, kw in ((delta_rule_reference, {}), (delta_rule_chunk, dict(chunk_size=16))):
        got = call(fn, x, qk_l2norm=True, scale=0.3, **kw)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert_all_close(run_with_grads(delta_rule_chunk, x, qk_l2norm=True, scale=0.3, chunk_size=16),
                     run_with_grads(delta_rule_reference, x, qk_l2norm=True, scale=0.3), rtol=1e-9, atol=1e-9)
    o, s = delta_rule_step(x["q"][:, 0], x["k"][:, 0], x["v"][:, 0], x["beta"][:, 0], x["log_a"][:, 0],
                           state=x["initial_state"], qk_l2norm=True, scale=0.3)
    torch.testing.assert_close(o, want[0][:, 0], rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------------------
# Packed documents
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_random_resets_match_reference(kind):
    T = 150
    x = make_inputs(kind, T, seed=5)
    g = torch.Generator().manual_seed(6)
    reset = torch.rand(B, T, generator=g) < 0.04
    reset[0, 64] = True  # on a chunk boundary
    reset[1, 0] = True  # at the start: discards the initial state
    want = run_with_grads(delta_rule_reference, x, reset=reset)
    got = run_with_grads(delta_rule_chunk, x, reset=reset, chunk_size=32)
    assert_all_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
@pytest.mark.parametrize("fn", [delta_rule_reference, delta_rule_chunk], ids=["reference", "chunk"])
def test_packed_row_equals_documents_one_by_one(kind, fn):
    lengths = [5, 70, 1, 40, 33]
    T = sum(lengths)
    x = make_inputs(kind, T, Bn=1, seed=7, init=False)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    reset = reset_from_cu_seqlens(cu, T)
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items() if t is not None}
    g = torch.Generator().manual_seed(8)
    w = torch.randn(1, T, H, V, generator=g, dtype=F64)
    w_s = torch.randn(1, H, K, V, generator=g, dtype=F64)
    kw = dict(chunk_size=16) if fn is delta_rule_chunk else {}
    per_token = lambda n, sl: None if leaves.get(n) is None else leaves[n][:, sl]  # noqa: E731

    o_p, s_p = fn(*(leaves.get(n) for n in NAMES[:5]), reset=reset, **kw)
    grads_p = torch.autograd.grad((o_p * w).sum() + (s_p * w_s).sum(), list(leaves.values()))
    outs, loss = [], 0.0
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        o_d, s_d = fn(*(per_token(n, slice(a, b)) for n in NAMES[:5]), **kw)
        outs.append(o_d)
        loss = loss + (o_d * w[:, a:b]).sum()
    grads_d = torch.autograd.grad(loss + (s_d * w_s).sum(), list(leaves.values()))

    torch.testing.assert_close(o_p, torch.cat(outs, 1), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_p, s_d, rtol=1e-10, atol=1e-10)
    for name, gp, gd in zip(leaves, grads_p, grads_d):
        torch.testing.assert_close(gp, gd, rtol=1e-10, atol=1e-10, msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
@pytest.mark.parametrize("fn", [delta_rule_reference, delta_rule_chunk], ids=["reference", "chunk"])
def test_reset_leaks_exactly_nothing(kind, fn):
    """After a reset nothing of the past survives: with v = 0 from the reset on, the outputs, the final state and
    the gradient reaching the (huge) initial state from them are exactly 0."""
    T, r = 40, 25
    x = make_inputs(kind, T, seed=21)
    x["initial_state"] = x["initial_state"] * 1e30
    x["v"][:, r:] = 0.0
    reset = torch.zeros(B, T, dtype=torch.bool)
    reset[0, r] = True
    reset[1, 32] = True  # on a chunk boundary (chunk 16)
    reset[1, r] = True
    s0 = x.pop("initial_state").requires_grad_(True)
    kw = dict(chunk_size=16) if fn is delta_rule_chunk else {}
    o, s = call(fn, dict(x, initial_state=s0), reset=reset, **kw)
    assert o[:, :r].abs().max() > 1e20  # the initial state is seen before the reset
    assert torch.equal(o[:, r:], torch.zeros_like(o[:, r:]))
    assert torch.equal(s, torch.zeros_like(s))
    (g,) = torch.autograd.grad(o[:, r:].sum() + s.sum(), s0)
    assert torch.equal(g, torch.zeros_like(g))


# ------------------------------------------------------------------------------------------------------------
# Gates near 0 and near 1, float32 against a float64 reference
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gates", ["near 1", "near 0", "mixed"])
@pytest.mark.parametrize("T,chunk", [(1, 64), (63, 64), (65, 64), (500, 64)])
def test_float32_against_float64(gates, T, chunk):
    x = make_inputs((True, True), T, seed=T + len(gates))
    g = torch.Generator().manual_seed(T)
    u = torch.rand(B, T, H, generator=g, dtype=F64)
    if gates == "near 1":  # a = 1 - 1e-4 .. 1: the state remembers for thousands of steps
        x["log_a"] = -1e-4 * u
    elif gates == "near 0":  # a = e^-300 .. e^-20: almost every step forgets everything
        x["log_a"] = -20.0 - 280.0 * u
    else:  # runs of mild gates with strong ones between them
        x["log_a"] = torch.where(u < 0.7, -0.01 * u, -20.0 * u)
    reset = torch.rand(B, T, generator=g) < 0.02
    want = run_with_grads(delta_rule_reference, x, reset=reset)
    x32 = {n: (t.float() if t is not None else None) for n, t in x.items()}
    o, s, grads = run_with_grads(delta_rule_chunk, x32, reset=reset, chunk_size=chunk)
    assert o.dtype == torch.float32 and s.dtype == torch.float32
    for a, b, name in [(o, want[0], "o"), (s, want[1], "state")] + [(grads[n], want[2][n], "d" + n) for n in grads]:
        assert torch.isfinite(a).all(), name
        scale = b.abs().max().item()
        err = (a.double() - b).abs().max().item()
        # float32 rounding, relative to each tensor's largest entry; the floor covers a gradient that float64 puts
        # at 1e-53 (through gates of e^-300) and float32 at exp(-87) = 1e-38 (gla.py's exponent floor)
        assert err <= 2e-5 * scale + 1e-30, f"{gates} T={T} {name}: max error {err:.3g} vs scale {scale:.3g}"


# ------------------------------------------------------------------------------------------------------------
# Step form, prefill then decode, bfloat16
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_prefill_with_chunks_then_decode_with_steps(kind):
    T, P = 61, 45
    x = make_inputs(kind, T, seed=12, dtype=torch.float32)
    o_full, s_full = call(delta_rule_chunk, x, chunk_size=16)
    head = {n: (t[:, :P] if t is not None and n != "initial_state" else t) for n, t in x.items()}
    o_pre, state = call(delta_rule_chunk, head, chunk_size=16)
    outs = [o_pre]
    for t in range(P, T):
        step = [None if x[n] is None else x[n][:, t] for n in NAMES[:5]]
        o, state = delta_rule_step(*step, state=state)
        outs.append(o[:, None])
    torch.testing.assert_close(torch.cat(outs, 1), o_full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, s_full, rtol=1e-5, atol=1e-5)


def test_step_without_state_starts_from_zero():
    x = make_inputs((True, True), 1, seed=13, init=False)
    o, s = delta_rule_step(*(x[n][:, 0] for n in NAMES[:5]))
    o_ref, s_ref = call(delta_rule_reference, x)
    torch.testing.assert_close(o, o_ref[:, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12)


# bfloat16 inputs are computed in float32: against the float32 result on the same rounded values, o differs by its
# own rounding to bfloat16 (2^-8 relative) and the state not at all beyond float32 summation order.
BF16_O_RTOL, BF16_O_ATOL, BF16_STATE_TOL = 1e-2, 2e-2, 1e-4


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_bfloat16_inputs_accumulate_in_float32(kind):
    x32 = make_inputs(kind, 90, seed=14, dtype=torch.float32, lo=-0.5)
    xb = {n: (t.bfloat16() if t is not None else None) for n, t in x32.items()}
    xr = {n: (t.float() if t is not None else None) for n, t in xb.items()}
    o_ref, s_ref = call(delta_rule_reference, xr)
    leaves = {n: t.clone().requires_grad_(True) for n, t in xb.items() if t is not None}
    o, s = call(delta_rule_chunk, {n: leaves.get(n) for n in NAMES}, chunk_size=32)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    torch.testing.assert_close(o.float(), o_ref, rtol=BF16_O_RTOL, atol=BF16_O_ATOL)
    torch.testing.assert_close(s, s_ref, rtol=BF16_STATE_TOL, atol=BF16_STATE_TOL)
    (o.float().sum() + s.sum()).backward()
    for n, t in leaves.items():
        assert t.grad.dtype == torch.bfloat16 and torch.isfinite(t.grad.float()).all(), n
    o_s, s_s = delta_rule_step(*(None if xb[n] is None else xb[n][:, 0] for n in NAMES[:5]))
    assert o_s.dtype == torch.bfloat16 and s_s.dtype == torch.float32


def test_dispatcher_is_the_chunk_form_on_the_cpu():
    x = make_inputs((True, True), 50, seed=16)
    torch.testing.assert_close(call(delta_rule, x, chunk_size=16), call(delta_rule_chunk, x, chunk_size=16),
                               rtol=0, atol=0)


def test_empty_sequence():
    x = make_inputs((True, True), 0, seed=17)
    for fn in (delta_rule_chunk, delta_rule_reference):
        o, s = call(fn, x)
        assert o.shape == (B, 0, H, V)
        torch.testing.assert_close(s, x["initial_state"])


def test_no_input_is_modified_in_place():
    x = make_inputs((True, True), 40, seed=15, dtype=torch.float32)
    before = {n: t.clone() for n, t in x.items()}
    call(delta_rule_chunk, x, chunk_size=8, qk_l2norm=True)
    for n, t in before.items():
        assert torch.equal(x[n], t), f"{n} was modified in place"


# ------------------------------------------------------------------------------------------------------------
# Bad input: shapes, and values that would make the recurrence blow up
# ------------------------------------------------------------------------------------------------------------

FORMS = [delta_rule_chunk, delta_rule_reference, delta_rule]
FORM_IDS = ["chunk", "reference", "dispatcher"]


@pytest.mark.parametrize("fn", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("over,needle", [
    (dict(q=torch.zeros(B, 10, H)), r"q must be 4-D"),
    (dict(k=torch.zeros(B, 10, H, K + 1)), r"k has shape \(2, 10, 3, 17\)"),
    (dict(v=torch.zeros(B, 9, H, V)), r"v has shape \(2, 9, 3, 24\)"),
    (dict(beta=torch.zeros(B, 10)), r"beta has shape \(2, 10\)"),
    (dict(log_a=torch.zeros(B, 10, H, 1)), r"log_a has shape \(2, 10, 3, 1\)"),
    (dict(initial_state=torch.zeros(B, H, V, K)), r"initial_state has shape \(2, 3, 24, 16\)"),
    (dict(q=torch.zeros(B, 10, H, K, dtype=torch.long)), r"q must be a floating-point"),
])
def test_bad_shapes_raise(fn, over, needle):
    x = make_inputs((True, True), 10, seed=18, dtype=torch.float32)
    x.update(over)
    with pytest.raises(ShapeError, match=needle):
        call(fn, x)


def _bad_values(name):
    x = make_inputs((True, True), 10, seed=18, dtype=torch.float32)
    if name == "beta high":
        x["beta"][1, 3, 2] = 2.5
    elif name == "beta negative":
        x["beta"][0, 0, 0] = -0.1
    elif name == "beta nan":
        x["beta"][0, 4, 1] = float("nan")
    elif name == "gate above 1":
        x["log_a"][1, 2, 0] = 0.5
    else:  # a key twice as long as a unit key
        x["k"][0, 7, 1] *= 2
    return x


@pytest.mark.parametrize("fn", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("name,needle", [
    ("beta high", r"beta must lie in \[0, 2\].*got 2.5 at \(1, 3, 2\)"),
    ("beta negative", r"beta must lie in \[0, 2\].*got -0.1 at \(0, 0, 0\)"),
    ("beta nan", r"beta must lie in \[0, 2\].*got nan"),
    ("gate above 1", r"log_a must be <= 0.*got 0.5 at \(1, 2, 0\)"),
    ("long key", r"key at \(0, 7, 1\) has L2 norm 2.*qk_l2norm=True"),
])
def test_values_that_would_blow_up_are_refused(fn, name, needle):
    """A clear one-line error before any work, never a NaN or an exploding state later."""
    with pytest.raises(ShapeError, match=needle):
        call(fn, _bad_values(name))


def test_long_keys_are_fine_with_normalisation_on():
    x = _bad_values("long key")
    o, s = call(delta_rule_chunk, x, qk_l2norm=True)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()


def test_unnormalised_keys_blow_up_without_the_check():
    """Why the key check exists: keys of norm 2 with b = 1 give eigenvalues 1 - 4 = -3, and the state grows as
    3^T (it is inf after a few hundred steps in float32)."""
    T = 200
    g = torch.Generator().manual_seed(0)
    k = 2 * unit(torch.randn(1, 1, 1, K, generator=g)).expand(1, T, 1, K)
    v = torch.randn(1, T, 1, V, generator=g)
    from linlm.ops.delta_chunk import chunk_forward

    o, s = chunk_forward(k, k, v, None, None, torch.zeros(1, 1, K, V), None, 64)
    assert not torch.isfinite(s).all() or s.abs().max() > 1e30


@pytest.mark.parametrize("over,needle", [
    (dict(q=torch.zeros(B, 1, H, K)), r"q must be 3-D"),
    (dict(v=torch.zeros(B + 1, H, V)), r"v has shape \(3, 3, 24\)"),
    (dict(beta=torch.zeros(B, 1, H)), r"beta has shape \(2, 1, 3\)"),
    (dict(beta=torch.full((B, H), 3.0)), r"beta must lie in \[0, 2\]"),
    (dict(log_a=torch.full((B, H), 0.1)), r"log_a must be <= 0"),
    (dict(state=torch.zeros(B, H, K, V + 1)), r"state has shape \(2, 3, 16, 25\)"),
])
def test_step_bad_input_raises(over, needle):
    g = torch.Generator().manual_seed(19)
    args = dict(q=torch.randn(B, H, K, generator=g), k=unit(torch.randn(B, H, K, generator=g)),
                v=torch.randn(B, H, V, generator=g), beta=None, log_a=None, state=None)
    args.update(over)
    with pytest.raises(ShapeError, match=needle):
        delta_rule_step(args["q"], args["k"], args["v"], args["beta"], args["log_a"], state=args["state"])


@pytest.mark.parametrize("chunk", [0, -4, 2.5, True])
def test_bad_chunk_size_raises(chunk):
    with pytest.raises(ConfigError, match="chunk_size"):
        call(delta_rule_chunk, make_inputs((True, True), 10), chunk_size=chunk)


@pytest.mark.parametrize("reset,needle", [
    (torch.zeros(B, 10), "bool"),
    (torch.zeros(B, 11, dtype=torch.bool), r"reset has shape \(2, 11\)"),
])
def test_bad_reset_raises(reset, needle):
    with pytest.raises(ShapeError, match=needle):
        call(delta_rule_chunk, make_inputs((True, True), 10), reset=reset)
