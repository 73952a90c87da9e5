"""Top-k routing, balance and z losses, grouped dispatch and combine."""

from __future__ import annotations

import math

import pytest
import torch

from linlm.errors import ConfigError, ShapeError
from linlm.ops import gather_sum_kernel, kernel_library
from linlm.ops.routing import (
    combine,
    dispatch,
    gather_rows,
    group_by_expert,
    invert_order,
    load_balance_loss,
    matmul_row_quantum,
    pad_groups,
    read_back,
    router_z_loss,
    top_k_route,
)


def logits_for(N=37, E=6, seed=0, dtype=torch.float32):
    return torch.randn(N, E, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 2


@pytest.mark.parametrize("k", [1, 2, 6])
def test_top_k_route_weights_indices_probs(k):
    logits = logits_for()
    weights, indices, probs = top_k_route(logits, k)
    assert weights.shape == (37, k) and indices.shape == (37, k) and probs.shape == (37, 6)
    assert weights.dtype == torch.float32 and probs.dtype == torch.float32 and indices.dtype == torch.long
    torch.testing.assert_close(weights.sum(-1), torch.ones(37))
    torch.testing.assert_close(probs, torch.softmax(logits, -1))
    # exactly k distinct experts per token, and they are the k most probable
    assert all(len(set(row.tolist())) == k for row in indices)
    kth = probs.gather(1, indices).min(-1).values
    masked = probs.scatter(1, indices, -1.0)
    assert (masked.max(-1).values <= kth).all()
    # weights are the chosen probabilities renormalised
    chosen = probs.gather(1, indices)
    torch.testing.assert_close(weights, chosen / chosen.sum(-1, keepdim=True))


def test_top_k_route_gradient_reaches_logits():
    logits = logits_for(N=5, E=4, dtype=torch.float64).requires_grad_(True)
    weights, _, probs = top_k_route(logits, 2)
    assert weights.dtype == torch.float64
    (weights[:, 0].sum() + probs[:, 3].sum()).backward()
    assert logits.grad.abs().sum() > 0


@pytest.mark.parametrize("k", [0, -1, 7, 2.0, True])
def test_bad_k_raises_config_error(k):
    with pytest.raises(ConfigError, match=r"`k` \(top_k.*\[1, 6\]"):
        top_k_route(logits_for(), k)


def test_bad_logits_raise_shape_error():
    with pytest.raises(ShapeError, match="logits"):
        top_k_route(torch.randn(2, 3, 4), 1)


def test_load_balance_loss_is_one_when_uniform_and_larger_when_skewed():
    E, N = 4, 64
    # uniform: every expert gets the same share of assignments and the same mean probability
    probs = torch.full((N, E), 1.0 / E)
    indices = torch.arange(N * 2).reshape(N, 2) % E
    torch.testing.assert_close(load_balance_loss(probs, indices, E), torch.tensor(1.0))
    # also 1.0 for non-uniform per-token probabilities whose mean is uniform, with balanced counts
    logits = torch.randn(N, E, generator=torch.Generator().manual_seed(1))
    probs_sym = torch.softmax(torch.cat([logits, logits.roll(1, 1), logits.roll(2, 1), logits.roll(3, 1)]), -1)
    idx_sym = torch.arange(4 * N)[:, None] % E
    torch.testing.assert_close(load_balance_loss(probs_sym, idx_sym, E), torch.tensor(1.0))
    # skewed: the router favours expert 0 and sends most tokens there
    logits = torch.zeros(N, E)
    logits[:, 0] = 2.0
    w, idx, p = top_k_route(logits, 1)
    loss = load_balance_loss(p, idx, E)
    expect = E * 1.0 * p[0, 0]  # f = (1, 0, 0, 0), P_0 = softmax(2, 0, 0, 0)_0
    torch.testing.assert_close(loss, expect)
    assert loss > 1.5
    # a hand computation on a tiny case: E = 2, k = 1, tokens to experts (0, 0, 1)
    p = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7]])
    idx = torch.tensor([[0], [0], [1]])
    want = 2 * ((2 / 3) * (1.8 / 3) + (1 / 3) * (1.2 / 3))
    torch.testing.assert_close(load_balance_loss(p, idx, 2), torch.tensor(want))


def test_load_balance_loss_gradient_flows_through_probs_only():
    logits = logits_for(N=20, E=5).requires_grad_(True)
    _, idx, probs = top_k_route(logits, 2)
    load_balance_loss(probs, idx, 5).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


def test_router_z_loss_matches_hand_computation():
    logits = torch.tensor([[0.0, 0.0], [1.0, 2.0], [math.log(3.0), 0.0]])
    lse = [math.log(2.0), math.log(math.e + math.e**2), math.log(4.0)]
    want = sum(v * v for v in lse) / 3
    torch.testing.assert_close(router_z_loss(logits), torch.tensor(want))
    big = torch.full((2, 3), 100.0)  # no overflow: logsumexp = 100 + log 3
    torch.testing.assert_close(router_z_loss(big), torch.tensor((100 + math.log(3.0)) ** 2))


def test_group_by_expert_counts_and_stable_order():
    idx = torch.randint(0, 7, (50, 3), generator=torch.Generator().manual_seed(2))
    order, counts = group_by_expert(idx, 9)  # experts 7, 8 get nothing
    flat = idx.reshape(-1)
    assert order.dtype == torch.long and counts.dtype == torch.long
    assert torch.equal(counts, torch.bincount(flat, minlength=9))
    assert counts[7] == 0 and counts[8] == 0
    assert torch.equal(torch.sort(order).values, torch.arange(150))  # a permutation
    assert (flat[order].diff() >= 0).all()  # sorted by expert
    for e in range(7):  # stable: within an expert, assignments keep their original order
        pos = order[flat[order] == e]
        assert (pos.diff() > 0).all()


def test_dispatch_combine_with_identity_experts_returns_x():
    N, D, E, k = 29, 11, 5, 2
    x = torch.randn(N, D, generator=torch.Generator().manual_seed(3))
    weights, idx, _ = top_k_route(logits_for(N, E, seed=4), k)
    x_sorted, order, counts = dispatch(x, idx, E)
    assert x_sorted.shape == (N * k, D)
    # rows are grouped by expert: the slice for expert e holds exactly the tokens routed to e
    for e, part in enumerate(x_sorted.split(counts.tolist())):
        tokens = (idx == e).any(1).nonzero().squeeze(1)
        torch.testing.assert_close(part, x[tokens])
    y = combine(x_sorted, order, weights, N)  # identity experts
    torch.testing.assert_close(y, x)  # weights sum to 1 per token


def test_invert_order_finds_each_assignment():
    idx = torch.randint(0, 5, (23, 3), generator=torch.Generator().manual_seed(8))
    order, _ = group_by_expert(idx, 5)
    rows = invert_order(order, 3)
    assert rows.shape == (23, 3)
    assert torch.equal(order[rows], torch.arange(69).view(23, 3))  # the sorted row of (token n, slot j) holds n * k + j


@pytest.mark.parametrize("quantum", [1, 4])
def test_pad_groups_lays_each_expert_out_in_whole_quanta(quantum):
    """Each expert's group starts where the previous one's padded group ends (a multiple of the quantum), holds its
    tokens in sorted order, and every (token, slot) finds its row; quantum 1 is the plain sorted layout."""
    idx = torch.randint(0, 5, (23, 2), generator=torch.Generator().manual_seed(3))
    idx[:, 1] = (idx[:, 0] + 1 + idx[:, 1] % 4) % 5  # two distinct experts per token
    order, counts = group_by_expert(idx, 5)
    src, rows, ends = pad_groups(order, counts, 2, quantum)
    assert bool((ends % quantum == 0).all()) and src.numel() == int(ends[-1])
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    assert bool((ends - starts >= counts).all()) and bool((ends - starts - counts < quantum).all())
    tokens = torch.arange(23)[:, None].expand(23, 2)
    assert torch.equal(src[rows], tokens)  # each assignment's row reads its token
    for e in range(5):  # each group: the expert's tokens in order, then padding no assignment names
        group = torch.arange(int(starts[e]), int(ends[e]))
        real = group[: int(counts[e])]
        assert torch.equal(src[real], (idx == e).any(1).nonzero().squeeze(1))
        assert not bool(torch.isin(group[int(counts[e]):], rows).any())
    if quantum == 1:
        assert torch.equal(src, order // 2) and torch.equal(rows, invert_order(order, 2))


def test_matmul_row_quantum_is_for_bfloat16_matmuls_on_the_cpu():
    x = torch.ones(2, 3)
    assert matmul_row_quantum(x) == 1 and matmul_row_quantum(x.double()) == 1
    assert matmul_row_quantum(x.bfloat16()) == 16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert matmul_row_quantum(x) == 16


@pytest.mark.parametrize("shape", [(2,), (2, 3)])
def test_gather_rows_gradient_matches_index_select_and_skips_padding(shape):
    """Each row of x is read at m listed positions of src (plus unlisted padding positions): the gradient is the sum
    of the listed positions' gradients, as index_select's would be without the padding."""
    gen = torch.Generator().manual_seed(9)
    N, m, pad = 13, 3, 4
    src = torch.cat([torch.arange(N).repeat(m)[torch.randperm(N * m, generator=gen)], torch.full((pad,), N - 1)])
    reads = torch.stack([(src[: N * m] == n).nonzero().squeeze(1) for n in range(N)])  # [N, m]
    x = torch.randn(N, *shape, dtype=torch.float64, generator=gen, requires_grad=True)
    out = gather_rows(x, src, reads)
    torch.testing.assert_close(out, x.detach().index_select(0, src))
    g = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    (out * g).sum().backward()
    ref = torch.zeros_like(x).index_add_(0, src[: N * m], g[: N * m])  # the padding's gradient is dropped
    torch.testing.assert_close(x.grad, ref)
    with torch.no_grad():  # no autograd Function where nothing is recorded
        assert gather_rows(x, src, reads).grad_fn is None


def test_combine_weights_each_slot():
    """Expert e multiplies by (e + 1): the result is sum_slot w * (idx + 1) * x, per token, checked by hand."""
    N, D, E, k = 17, 4, 3, 2
    x = torch.randn(N, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    weights, idx, _ = top_k_route(logits_for(N, E, seed=6, dtype=torch.float64), k)
    x_sorted, order, counts = dispatch(x, idx, E)
    scale = torch.repeat_interleave(torch.arange(1, E + 1, dtype=torch.float64), counts)
    y_sorted = (x_sorted * scale[:, None]).requires_grad_(True)
    w = weights.clone().requires_grad_(True)
    y = combine(y_sorted, order, w, N)
    want = ((w * (idx + 1)).sum(1))[:, None] * x
    torch.testing.assert_close(y, want)
    g = torch.randn(N, D, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    (y * g).sum().backward()
    torch.testing.assert_close(w.grad, ((idx + 1)[..., None] * (x * g)[:, None, :]).sum(-1))
    # each sorted row's gradient is its token's output gradient times that slot's weight
    token, slot = order // k, order % k
    torch.testing.assert_close(y_sorted.grad, w.detach()[token, slot][:, None] * g[token])


@pytest.mark.parametrize("backend", ["kernel", "torch"])
@pytest.mark.parametrize("m, padded", [(1, True), (2, True), (2, False), (4, True)])
def test_read_back_weights_each_slot_and_sends_gradients_to_the_read_rows(backend, m, padded, monkeypatch):
    """out[n] = sum_j w[n, j] src[idx[n, j]], no src row read twice: the compiled kernel (backend "kernel") and
    embedding_bag (LINLM_SCAN_BACKEND=torch) against index arithmetic, in float64. 70 tokens span three of the
    kernel's 32-row items; with padding, 9 src rows are read by no token and get a zero gradient; without, every
    row is read (the MLP's combine: a permutation)."""
    if backend == "kernel" and not kernel_library.available():
        pytest.skip("no C compiler: the kernel is not built")
    if backend == "torch":
        monkeypatch.setenv("LINLM_SCAN_BACKEND", "torch")
    gen = torch.Generator().manual_seed(m)
    N, D = 70, 19
    S = N * m + (9 if padded else 0)
    idx = torch.randperm(S, generator=gen)[: N * m].view(N, m)
    src = torch.randn(S, D, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.rand(N, m, dtype=torch.float64, generator=gen, requires_grad=True)
    out = read_back(src, idx, w)
    torch.testing.assert_close(out, (w[..., None] * src[idx]).sum(1))
    g = torch.randn(N, D, dtype=torch.float64, generator=gen)
    (out * g).sum().backward()
    want_src = torch.zeros(S, D, dtype=torch.float64).index_add_(0, idx.reshape(-1),
                                                                 (w.detach()[..., None] * g[:, None]).reshape(-1, D))
    torch.testing.assert_close(src.grad, want_src)
    torch.testing.assert_close(w.grad, (src.detach()[idx] * g[:, None]).sum(-1))
    if padded:  # the rows no token reads
        unread = torch.ones(S, dtype=torch.bool).index_fill_(0, idx.reshape(-1), False)
        assert unread.sum() == 9 and torch.equal(src.grad[unread], torch.zeros(9, D, dtype=torch.float64))


def test_read_back_gradcheck():
    gen = torch.Generator().manual_seed(3)
    idx = torch.randperm(15, generator=gen)[:12].view(6, 2)
    src = torch.randn(15, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.rand(6, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s, v: read_back(s, idx, v), (src, w))


def test_gather_sum_kernel_takes_rows_with_weights_in_their_compute_dtype():
    """The kernel takes float32, float64 and bfloat16 rows with weights of the dtype it sums in (float32 for
    bfloat16 rows); read_back converts the weights to it, and sends float16 rows through embedding_bag in float32."""
    if not kernel_library.available():
        pytest.skip("no C compiler: the kernel is not built")
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(6, 4, generator=gen)
    assert gather_sum_kernel.gather_sum_takes(x, torch.rand(3, 2))
    assert gather_sum_kernel.gather_sum_takes(x.double(), torch.rand(3, 2).double())
    assert gather_sum_kernel.gather_sum_takes(x.bfloat16(), torch.rand(3, 2))
    assert not gather_sum_kernel.gather_sum_takes(x.bfloat16(), torch.rand(3, 2).bfloat16())
    assert not gather_sum_kernel.gather_sum_takes(x.half(), torch.rand(3, 2))
    assert not gather_sum_kernel.gather_sum_takes(x, torch.rand(3, 2).double())
    assert not gather_sum_kernel.gather_sum_takes(x[None], torch.rand(3, 2))
    idx = torch.tensor([[0, 5], [2, 1], [4, 3]])
    w = torch.rand(3, 2, generator=gen, dtype=torch.float64)  # taken in float32
    for xl in (x.bfloat16(), x.half()):  # the kernel, embedding_bag: both sum in float32 and round once
        want = (w.float()[..., None] * xl.float()[idx]).sum(1)
        got = read_back(xl, idx, w)
        assert got.dtype == xl.dtype
        torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=0)


def test_combine_keeps_dtype_of_expert_outputs():
    x = torch.randn(8, 3).bfloat16()
    weights, idx, _ = top_k_route(logits_for(8, 4), 2)
    xs, order, _ = dispatch(x, idx, 4)
    y = combine(xs, order, weights, 8)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), x.float(), rtol=1e-2, atol=1e-2)


def test_bad_indices_and_shapes():
    idx = torch.tensor([[0, 3]])
    with pytest.raises(ShapeError, match=r"`indices`.*\[0, 2\]"):
        group_by_expert(idx, 3)
    with pytest.raises(ShapeError, match="`x`"):
        dispatch(torch.randn(2, 4), idx, 4)
    with pytest.raises(ShapeError, match="`probs`"):
        load_balance_loss(torch.rand(1, 3), idx, 4)
    with pytest.raises(ShapeError, match="`weights`"):
        combine(torch.randn(2, 4), torch.arange(2), torch.rand(2, 2), 1)
