"""The three forms of the selective scan agree: outputs, final states and every gradient."""

from __future__ import annotations

import pytest
import torch

import linlm.ops.selective_scan as ss
from linlm.errors import ConfigError, ShapeError
from linlm.ops.selective_scan import (
    selective_scan,
    selective_scan_chunked,
    selective_scan_reference,
    selective_scan_step,
)

F64 = torch.float64


def make_inputs(Bt=2, T=37, Din=5, N=3, *, dtype=F64, seed=0, batched=False, D="vec", init=True, dt_scale=1.0):
    """Asymmetric sizes (Din != N, Bt != both) so a transposed index shows up as a shape or value error."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    u = r(Bt, T, Din)
    dt = torch.nn.functional.softplus(r(Bt, T, Din) - 1.0) * dt_scale
    A = -torch.exp(r(*((Bt,) if batched else ()), Din, N) * 0.7)
    B, C = r(Bt, T, N), r(Bt, T, N)
    Dv = {"none": None, "vec": r(Din), "batch": r(Bt, Din)}[D]
    s0 = r(Bt, Din, N) if init else None
    return {k: (v.to(dtype) if v is not None else None) for k, v in
            dict(u=u, dt=dt, A=A, B=B, C=C, D=Dv, initial_state=s0).items()}


def run_with_grads(fn, inputs, *, reset=None, seed=1, **kw):
    """Run fn, backprop random cotangents of y and the final state; return (y, state, {name: grad})."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in inputs.items() if v is not None}
    args = {k: leaves.get(k) for k in inputs}
    y, s = fn(args["u"], args["dt"], args["A"], args["B"], args["C"], args["D"],
              initial_state=args["initial_state"], reset=reset, **kw)
    g = torch.Generator().manual_seed(seed)
    gy = torch.randn(y.shape, generator=g, dtype=F64).to(y.dtype)
    gs = torch.randn(s.shape, generator=g, dtype=F64).to(s.dtype)
    loss = (y * gy).sum() + (s * gs).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return y.detach(), s.detach(), dict(zip(leaves, grads))


def assert_close_all(got, want, *, rtol, atol):
    (y1, s1, g1), (y2, s2, g2) = got, want
    for name, a, b in [("y", y1, y2), ("state", s1, s2)] + [(f"grad {k}", g1[k], g2[k]) for k in g2]:
        assert torch.isfinite(a).all(), f"{name} is not finite"
        torch.testing.assert_close(a.to(b.dtype), b, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
    assert set(g1) == set(g2)


def brute_force(u, dt, A, B, C, D, s0):
    """Closed form, no recurrence: y_t = sum_{s<=t} <C_t, exp(A * sum_{s<i<=t} dt_i) B_s> dt_s u_s + the s0 term."""
    Bt, T, Din = u.shape
    y = torch.zeros(Bt, T, Din, dtype=F64)
    for b in range(Bt):
        for t in range(T):
            for s in range(t + 1):
                decay = torch.exp(A * dt[b, s + 1:t + 1].sum(0)[:, None])  # [Din, N]
                y[b, t] += (decay * B[b, s] * C[b, t]).sum(-1) * dt[b, s] * u[b, s]
            y[b, t] += (torch.exp(A * dt[b, :t + 1].sum(0)[:, None]) * s0[b] * C[b, t]).sum(-1)
    return y + D * u


def test_reference_matches_closed_form():
    x = make_inputs(Bt=2, T=6, Din=4, N=3)
    y, s = selective_scan_reference(**x)
    want = brute_force(x["u"], x["dt"], x["A"], x["B"], x["C"], x["D"], x["initial_state"])
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    # final state: s_T = exp(A sum dt) s0 + sum_s exp(A sum_{s<i<=T-1} dt_i) B_s dt_s u_s
    b, d = 1, 2
    dtb, ub = x["dt"][b, :, d], x["u"][b, :, d]
    s_want = torch.exp(x["A"][d] * dtb.sum()) * x["initial_state"][b, d]
    for t in range(6):
        s_want = s_want + torch.exp(x["A"][d] * dtb[t + 1:].sum()) * x["B"][b, t] * dtb[t] * ub[t]
    torch.testing.assert_close(s[b, d], s_want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("T", [1, 63, 500])
@pytest.mark.parametrize("block_elems", [None, 1])
def test_chunked_matches_reference_float64(T, block_elems, monkeypatch):
    """Chunk 16 (500 and 63 are not multiples); block_elems=1 forces one chunk per block, so the block carry and
    the backward's block recomputation are exercised too."""
    if block_elems is not None:
        monkeypatch.setattr(ss, "_BLOCK_ELEMS", block_elems)
    x = make_inputs(T=T, seed=T)
    want = run_with_grads(selective_scan_reference, x)
    got = run_with_grads(selective_scan_chunked, x, chunk_size=16)
    assert_close_all(got, want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 8, 64, 1000])
def test_chunk_sizes_and_no_initial_state(chunk_size):
    x = make_inputs(T=45, D="none", init=False, seed=3)
    want = run_with_grads(selective_scan_reference, x)
    got = run_with_grads(selective_scan_chunked, x, chunk_size=chunk_size)
    assert_close_all(got, want, rtol=1e-9, atol=1e-10)


def test_batched_A_and_D():
    x = make_inputs(Bt=3, T=50, batched=True, D="batch", seed=4)
    want = run_with_grads(selective_scan_reference, x)
    got = run_with_grads(selective_scan_chunked, x, chunk_size=8)
    assert_close_all(got, want, rtol=1e-9, atol=1e-10)
    assert got[2]["A"].shape == (3, 5, 3) and got[2]["D"].shape == (3, 5)
    # the batch rows are independent experts: row 1 alone gives row 1's result
    one = {k: (v[1:2] if v is not None else None) for k, v in x.items()}
    y1, s1 = selective_scan_chunked(**one, chunk_size=8)
    torch.testing.assert_close(y1[0], got[0][1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s1[0], got[1][1], rtol=1e-12, atol=1e-12)


def test_float32_chunked_is_accurate_against_float64():
    """Float32 inputs at a realistic size, checked against the float64 definition (not against float32 rounding)."""
    x64 = make_inputs(Bt=2, T=300, Din=24, N=16, seed=5)
    want = run_with_grads(selective_scan_reference, x64)
    x32 = {k: (v.float() if v is not None else None) for k, v in x64.items()}
    got = run_with_grads(selective_scan_chunked, x32)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    assert_close_all(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dt_scale", [20.0, 200.0])
def test_large_decays_stay_finite_and_accurate(dt_scale):
    """dt * A reaches -20 (and -200) per step; products of decays underflow to 0 and must not become NaN or inf."""
    x64 = make_inputs(Bt=2, T=130, Din=6, N=4, seed=6, dt_scale=1.0)
    x64["dt"] = torch.rand(2, 130, 6, generator=torch.Generator().manual_seed(7), dtype=F64) * (dt_scale / 2)
    x64["A"] = -torch.linspace(0.05, 2.0, 24, dtype=F64).reshape(6, 4)  # |A| up to 2: dt * A down to -dt_scale
    assert (x64["dt"][..., None] * x64["A"]).min() < -0.9 * dt_scale
    want = run_with_grads(selective_scan_reference, x64)
    x32 = {k: (v.float() if v is not None else None) for k, v in x64.items()}
    got = run_with_grads(selective_scan_chunked, x32, chunk_size=64)
    assert_close_all(got, want, rtol=1e-4, atol=1e-4)


def packed_and_separate(fn, lengths_per_row, seed, **kw):
    """Pack documents into rows with reset; run each document alone; return both, with gradients of the inputs."""
    T = sum(lengths_per_row[0])
    assert all(sum(r) == T for r in lengths_per_row)
    Bt = len(lengths_per_row)
    x = make_inputs(Bt=Bt, T=T, seed=seed)
    reset = torch.zeros(Bt, T, dtype=torch.bool)
    for b, row in enumerate(lengths_per_row):
        starts = torch.tensor([0] + list(row[:-1])).cumsum(0)
        reset[b, starts] = True
    y, s, g = run_with_grads(fn, x, reset=reset, **kw)
    # separately: every document from a zero state (the row's initial state is dropped by the reset at t = 0)
    ys = torch.empty_like(y)
    for b, row in enumerate(lengths_per_row):
        t0 = 0
        for n in row:
            doc = {k: (v[b:b + 1, t0:t0 + n] if k in ("u", "dt", "B", "C") else None) for k, v in x.items()}
            doc["A"], doc["D"] = x["A"], x["D"]
            y_doc, s_doc = selective_scan_reference(**doc)
            ys[b, t0:t0 + n] = y_doc[0]
            t0 += n
        torch.testing.assert_close(s[b], s_doc[0], rtol=1e-10, atol=1e-10)  # final state = last document's
    return y, ys, g


@pytest.mark.parametrize("fn", [selective_scan_reference, selective_scan_chunked], ids=["reference", "chunked"])
def test_packed_rows_equal_documents_run_separately(fn):
    rows = [[20, 1, 49, 30], [63, 37]]  # boundaries inside and on chunk edges, a one-token document
    kw = {"chunk_size": 16} if fn is selective_scan_chunked else {}
    y, ys, g = packed_and_separate(fn, rows, seed=8, **kw)
    torch.testing.assert_close(y, ys, rtol=1e-10, atol=1e-10)
    # reset at t = 0 drops the initial state: its gradient is exactly zero
    assert torch.equal(g["initial_state"], torch.zeros_like(g["initial_state"]))


def test_reset_gradients_match_reference():
    x = make_inputs(Bt=2, T=70, seed=9)
    reset = torch.rand(2, 70, generator=torch.Generator().manual_seed(10)) < 0.08
    reset[0, 16] = reset[1, 17] = True  # on and just after a chunk edge
    want = run_with_grads(selective_scan_reference, x, reset=reset)
    got = run_with_grads(selective_scan_chunked, x, reset=reset, chunk_size=16)
    assert_close_all(got, want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("form", ["chunked", "kernel"])
def test_gradcheck_chunked_against_finite_differences(form):
    """The hand-written backwards (chunked form, compiled kernel) against finite differences, not the reference."""
    if form == "kernel" and not ss.kernel_library.available():
        pytest.skip("no C compiler: the kernel is not built")
    kw = {"chunk_size": 4} if form == "chunked" else {}
    scan = selective_scan_chunked if form == "chunked" else ss.selective_scan_kernel
    x = make_inputs(Bt=2, T=11, Din=3, N=2, seed=11, batched=True, D="batch")
    reset = torch.zeros(2, 11, dtype=torch.bool)
    reset[1, 5] = True
    names = ["u", "dt", "A", "B", "C", "D", "initial_state"]
    leaves = [x[k].clone().requires_grad_(True) for k in names]

    def f(u, dt, A, B, C, D, s0):  # dt >= 0.02 and A <= -0.1 here, so nudges of 1e-6 keep them valid
        return scan(u, dt, A, B, C, D, initial_state=s0, reset=reset, **kw)

    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_step_and_prefill_then_decode_match_reference():
    x = make_inputs(Bt=2, T=40, seed=12)
    y_ref, s_ref = selective_scan_reference(**x)
    # decode every token from the initial state
    state, ys = x["initial_state"], []
    for t in range(40):
        y_t, state = selective_scan_step(x["u"][:, t], x["dt"][:, t], x["A"], x["B"][:, t], x["C"][:, t], x["D"],
                                         state=state)
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys, 1), y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state, s_ref, rtol=1e-12, atol=1e-12)
    # prefill 25 tokens with the chunked form, decode the rest
    head = {k: (v[:, :25] if k in ("u", "dt", "B", "C") else v) for k, v in x.items()}
    y_head, state = selective_scan_chunked(**head, chunk_size=8)
    torch.testing.assert_close(y_head, y_ref[:, :25], rtol=1e-10, atol=1e-10)
    for t in range(25, 40):
        y_t, state = selective_scan_step(x["u"][:, t], x["dt"][:, t], x["A"], x["B"][:, t], x["C"][:, t], x["D"],
                                         state=state)
        torch.testing.assert_close(y_t, y_ref[:, t], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, s_ref, rtol=1e-10, atol=1e-10)


def test_step_without_state_and_batched():
    x = make_inputs(Bt=3, T=1, batched=True, D="batch", init=False, seed=13)
    y_ref, s_ref = selective_scan_reference(**x)
    y, s = selective_scan_step(x["u"][:, 0], x["dt"][:, 0], x["A"], x["B"][:, 0], x["C"][:, 0], x["D"])
    torch.testing.assert_close(y, y_ref[:, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12)


def test_dtypes_dispatcher_and_optional_final_state():
    x = make_inputs(T=33, seed=14, dtype=torch.float32)
    xb = {k: (v.bfloat16() if k in ("u", "dt", "B", "C") else v) for k, v in x.items()}
    y, s = selective_scan(**xb)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32
    y_ref, s_ref = selective_scan_reference(**xb)
    assert y_ref.dtype == torch.bfloat16 and s_ref.dtype == torch.float32
    torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-5)  # same bf16 inputs, float32 arithmetic in both
    y2, none = selective_scan_chunked(**x, output_final_state=False)
    assert none is None
    y3, _ = selective_scan(**x, chunk_size=5)
    torch.testing.assert_close(y2, y3, rtol=1e-5, atol=1e-5)
    _, none = selective_scan_reference(**x, output_final_state=False)
    assert none is None
    # an empty sequence returns an empty y and the initial state
    empty = {k: (v[:, :0] if k in ("u", "dt", "B", "C") else v) for k, v in x.items()}
    for fn in (selective_scan_reference, selective_scan_chunked):
        y0, s0 = fn(**empty)
        assert y0.shape == (2, 0, 5)
        torch.testing.assert_close(s0, x["initial_state"])


def _bad_cases():
    x = make_inputs(Bt=2, T=7, Din=5, N=3, init=True)
    cases = {
        "u 2-D": dict(u=x["u"][0]),
        "dt wrong T": dict(dt=x["dt"][:, :6]),
        "A transposed": dict(A=x["A"].T.contiguous()),
        "A wrong batch": dict(A=x["A"].expand(3, 5, 3).contiguous()),
        "A 1-D": dict(A=x["A"][0]),
        "B wrong N": dict(B=x["B"][..., :2]),
        "C swapped with u": dict(C=x["u"]),
        "D wrong length": dict(D=x["D"][:4]),
        "initial_state transposed": dict(initial_state=x["initial_state"].transpose(1, 2)),
        "reset wrong shape": dict(reset=torch.zeros(2, 6, dtype=torch.bool)),
        "reset not bool": dict(reset=torch.zeros(2, 7)),
        "A positive": dict(A=-x["A"]),
        "dt negative": dict(dt=-x["dt"]),
    }
    return x, cases


@pytest.mark.parametrize("fn", [selective_scan_reference, selective_scan_chunked], ids=["reference", "chunked"])
@pytest.mark.parametrize("case", list(_bad_cases()[1]))
def test_bad_inputs_raise_shape_error(fn, case):
    x, cases = _bad_cases()
    bad = {**x, **cases[case]}
    name = next(iter(cases[case]))
    with pytest.raises(ShapeError, match=f"`{name}`"):
        fn(**bad)


def test_bad_step_inputs_and_chunk_size():
    x = make_inputs(Bt=2, T=1, Din=5, N=3)
    u, dt, A, B, C, D, s0 = (x[k] for k in ("u", "dt", "A", "B", "C", "D", "initial_state"))
    with pytest.raises(ShapeError, match="`u`"):
        selective_scan_step(u, dt, A, B[:, 0], C[:, 0], D, state=s0)  # u still [Bt, T, Din]
    with pytest.raises(ShapeError, match="`B`"):
        selective_scan_step(u[:, 0], dt[:, 0], A, B, C[:, 0], D, state=s0)
    with pytest.raises(ShapeError, match="`state`"):
        selective_scan_step(u[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], D, state=s0[:1])
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ConfigError, match="chunk_size"):
            selective_scan_chunked(**x, chunk_size=bad)


def test_block_buffers_are_bounded():
    """Working memory is a few buffers of about _BLOCK_ELEMS elements, not [Bt, T, Din, N] (nor [.., C, C, ..])."""
    for Bt, Tp, Din, N, chunk in [(1, 2048, 1024, 16, 64), (2, 1040, 64, 16, 16), (2, 256, 512, 16, 64)]:
        blocks = ss._Blocks(torch.zeros(1), Bt=Bt, Tp=Tp, Din=Din, N=N, chunk=chunk, n_buffers=2)
        per_step = Bt * Din * N
        assert blocks.size % chunk == 0
        assert blocks.size * per_step <= max(ss._BLOCK_ELEMS, chunk * per_step)
        assert all(f.numel() == blocks.size * per_step for f in blocks._flat)
        assert blocks.bounds[0][0] == 0 and blocks.bounds[-1][1] == Tp
        assert all(a[1] == b[0] for a, b in zip(blocks.bounds, blocks.bounds[1:]))


@pytest.mark.parametrize("reverse", [False, True])
def test_tree_scan_core_matches_a_loop(reverse):
    """The in-chunk Brent-Kung scan plus carry, for every power-of-two chunk, against h_t = h_t + w_t h_{t-+1}."""
    g = torch.Generator().manual_seed(15)
    for chunk in [1, 2, 4, 8, 16, 32, 64, 128]:
        L = 256
        w = torch.rand(2, L, 3, 2, generator=g, dtype=F64)
        h = torch.randn(2, L, 3, 2, generator=g, dtype=F64)
        carry = torch.randn(2, 3, 2, generator=g, dtype=F64)
        want, s = torch.empty_like(h), carry
        for t in (range(L - 1, -1, -1) if reverse else range(L)):
            s = h[:, t] + w[:, t] * s
            want[:, t] = s
        got, out = ss._linear_scan_block(w.clone(), h.clone(), carry, chunk, reverse)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=lambda m: f"chunk {chunk}: {m}")
        torch.testing.assert_close(out, s, rtol=1e-12, atol=1e-12)


def test_chunked_form_is_not_a_loop_over_time_steps():
    """The number of tensor ops grows with T / chunk, not with T: count aten calls over forward + backward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    def ops(T):
        x = make_inputs(Bt=1, T=T, Din=4, N=2, dtype=torch.float32, seed=16)
        leaves = {k: v.requires_grad_(True) for k, v in x.items()}
        Count.n = 0
        with Count():
            y, s = selective_scan_chunked(**leaves, chunk_size=64)
            (y.sum() + s.sum()).backward()
        return Count.n

    small, big = ops(1024), ops(4096)
    # a loop over steps would cost well over 10 ops per step (forward and backward); the chunk loop costs about 27
    # (mostly views) per chunk of 64 steps, i.e. under 0.5 per step
    assert big < 4096 / 2, big
    assert (big - small) / (4096 - 1024) < 0.5, (small, big)
