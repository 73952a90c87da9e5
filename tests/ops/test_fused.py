"""The fused RoPE, GLU and RMSNorm functions against their composite definitions: values and every gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linlm.layers.norm import RMSNorm
from linlm.ops.fused import (
    default_chunk_rows,
    glu,
    glu_reference,
    linear_cross_entropy,
    linear_cross_entropy_reference,
    rms_norm,
    rms_norm_reference,
    rope_angles,
    rope_qkv,
    rope_reference,
)


def rand(*shape, seed=0, dtype=torch.float64, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(requires_grad)


def grads(out, inputs, seed=1):
    upstream = rand(*out.shape, seed=seed, dtype=out.dtype, requires_grad=False)
    return torch.autograd.grad(out, inputs, upstream)


# ---------------------------------------------------------------------------------------------------------- RoPE


def rope_qkv_by_reference(qkv, cos, sin):
    q, k, v = qkv.transpose(1, 3).unbind(2)  # [B, H, T, D] each
    return torch.stack([rope_reference(q, cos, sin), rope_reference(k, cos, sin), v])


@pytest.mark.parametrize("T", [1, 7, 63])
@pytest.mark.parametrize("offset", [0, 1000])
def test_rope_qkv_matches_reference(T, offset):
    qkv = rand(2, T, 3, 3, 8)
    cos, sin = rope_angles(torch.arange(offset, offset + T), 8, 10000.0, torch.float64)
    out = rope_qkv(qkv, cos, sin)
    ref = rope_qkv_by_reference(qkv, cos, sin)
    assert out.is_contiguous() and torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert out.shape == (3, 2, 3, T, 8)
    torch.testing.assert_close(out[2], qkv[:, :, 2].transpose(1, 2), rtol=0, atol=0)
    (g,), (g_ref,) = grads(out, [qkv]), grads(ref, [qkv])
    assert torch.isfinite(g).all()
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)


def test_rope_qkv_gradcheck_on_a_strided_input():
    # A transposed base makes qkv non-contiguous, as a view of someone else's buffer would be.
    qkv = rand(2, 3, 3, 5, 4, requires_grad=False).transpose(0, 1).requires_grad_()  # B=3, T=2
    assert not qkv.is_contiguous()
    cos, sin = rope_angles(torch.arange(5, 7), 4, 100.0, torch.float64)
    torch.autograd.gradcheck(lambda x: rope_qkv(x, cos, sin), (qkv,))


def test_rope_scores_depend_only_on_relative_position():
    qkv = rand(1, 6, 3, 2, 16, requires_grad=False)

    def scores(start):
        cos, sin = rope_angles(torch.arange(start, start + 6), 16, 10000.0, torch.float64)
        q, k, _ = rope_qkv(qkv, cos, sin).unbind(0)
        return torch.einsum("bhtd,bhsd->bhts", q, k)

    # The angles are formed in float32 (as transformers does), so a shift changes them by float32 rounding only.
    torch.testing.assert_close(scores(0), scores(37), rtol=1e-5, atol=1e-5)
    # and the rotation does change them relative to no rotation at all
    plain = torch.einsum("bthd,bshd->bhts", qkv[:, :, 0], qkv[:, :, 1])
    assert (scores(0) - plain).abs().max() > 1e-3


def test_rope_qkv_rejects_bad_shapes():
    cos, sin = rope_angles(torch.arange(4), 8, 10000.0, torch.float32)
    with pytest.raises(ValueError, match=r"\[B, T, 3, H, D\]"):
        rope_qkv(torch.zeros(1, 4, 2, 1, 8), cos, sin)
    with pytest.raises(ValueError, match=r"cos and sin must be \[T, D/2\] = \[5, 4\]"):
        rope_qkv(torch.zeros(1, 5, 3, 1, 8), cos, sin)


# ----------------------------------------------------------------------------------------------------------- GLU


@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("shape", [(1, 2), (2, 63, 10), (5, 1, 3, 16)])
def test_glu_matches_reference(activation, shape):
    h = rand(*shape)
    out, ref = glu(h, activation), glu_reference(h, activation)
    assert out.shape == (*shape[:-1], shape[-1] // 2)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    (g,), (g_ref,) = grads(out, [h]), grads(ref, [h])
    assert torch.isfinite(g).all()
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("activation", ["silu", None])
def test_glu_gradcheck(activation):
    h = rand(3, 2, 12, requires_grad=False)[:, :, 2:].requires_grad_()  # a sliced, non-contiguous input
    torch.autograd.gradcheck(lambda x: glu(x, activation), (h,))


def test_glu_bfloat16_follows_reference():
    h = rand(4, 32, dtype=torch.float32).bfloat16().detach().requires_grad_(True)
    out, ref = glu(h), glu_reference(h, "silu")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(grads(out, [h])[0], grads(ref, [h])[0])


def test_glu_rejects_bad_input():
    with pytest.raises(ValueError, match="activation"):
        glu(torch.zeros(2, 4), "gelu")
    with pytest.raises(ValueError, match="even"):
        glu(torch.zeros(2, 5))


# ------------------------------------------------------------------------------------------------------- RMSNorm


@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 63, 24)])
def test_rms_norm_matches_reference(with_weight, shape):
    x = rand(*shape) * 3 + 0.5
    w = rand(shape[-1], seed=5) if with_weight else None
    inputs = [x] + ([w] if with_weight else [])
    out, ref = rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    got, want = grads(out, inputs), grads(ref, inputs)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_rms_norm_gradcheck_and_frozen_weight():
    x = rand(4, 3, 6)
    w = rand(6, seed=2)
    torch.autograd.gradcheck(lambda a, b: rms_norm(a, b, 1e-5), (x, w))
    frozen = w.detach()
    (g,) = torch.autograd.grad(rms_norm(x, frozen, 1e-5).sum(), [x])
    (g_ref,) = torch.autograd.grad(rms_norm_reference(x, frozen, 1e-5).sum(), [x])
    torch.testing.assert_close(g, g_ref)


def test_rms_norm_eps_dominates_tiny_inputs():
    x = torch.full((2, 8), 1e-6, dtype=torch.float64)
    out = rms_norm(x, None, 1.0)
    torch.testing.assert_close(out, x / (1e-12 + 1.0) ** 0.5)


def test_rms_norm_module_float32_uses_fused_and_bfloat16_falls_back():
    norm = RMSNorm(16, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 16))
    x = rand(3, 5, 16, dtype=torch.float32)
    out = norm(x)
    assert type(out.grad_fn).__name__ == "_RMSNormBackward"
    torch.testing.assert_close(out, F.rms_norm(x, (16,), norm.weight, 1e-6))
    norm = norm.bfloat16()
    xb = x.detach().bfloat16()
    out_b = norm(xb)
    assert out_b.dtype == torch.bfloat16
    torch.testing.assert_close(out_b, F.rms_norm(xb, (16,), norm.weight, 1e-6), rtol=0, atol=0)


def test_rms_norm_rejects_wrong_weight():
    with pytest.raises(ValueError, match=r"weight must be \[8\]"):
        rms_norm(torch.zeros(2, 8), torch.ones(4), 1e-6)


# ---------------------------------------------------------------------------------- LM head + cross-entropy


def ce_inputs(N=23, d=6, V=11, dtype=torch.float64, ignore=()):
    h = rand(N, d, seed=3, dtype=dtype)
    w = rand(V, d, seed=4, dtype=dtype)
    targets = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(5))
    for i in ignore:
        targets[i] = -100
    return h, w, targets


@pytest.mark.parametrize("rows", [1, 5, 23, 1000])
@pytest.mark.parametrize("ignore", [(), (0, 7, 22)])
def test_linear_cross_entropy_matches_reference(rows, ignore):
    h, w, t = ce_inputs(ignore=ignore)
    loss = linear_cross_entropy(h, w, t, chunk_rows=rows)
    ref = linear_cross_entropy_reference(h, w, t)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    # a scale other than 1 on the loss (gradient accumulation divides by the number of micro-batches)
    got = torch.autograd.grad(loss * 0.25, [h, w])
    want = torch.autograd.grad(ref * 0.25, [h, w])
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    if ignore:
        assert (got[0][list(ignore)] == 0).all()


def test_linear_cross_entropy_gradcheck_and_single_input_grads():
    h, w, t = ce_inputs(N=5, d=3, V=4, ignore=(2,))
    torch.autograd.gradcheck(lambda a, b: linear_cross_entropy(a, b, t, chunk_rows=2), (h, w))
    (gh,) = torch.autograd.grad(linear_cross_entropy(h, w.detach(), t), [h])
    (gh_ref,) = torch.autograd.grad(linear_cross_entropy_reference(h, w.detach(), t), [h])
    torch.testing.assert_close(gh, gh_ref)


def test_linear_cross_entropy_without_grad_and_all_ignored():
    h, w, t = ce_inputs()
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, w, t, chunk_rows=4), linear_cross_entropy_reference(h, w, t))
    none_kept = torch.full_like(t, -100)
    assert torch.isnan(linear_cross_entropy(h, w, none_kept)) and torch.isnan(linear_cross_entropy_reference(h, w, none_kept))


def test_linear_cross_entropy_under_bfloat16_autocast_is_as_accurate_as_reference():
    h, w, t = ce_inputs(N=64, d=32, V=50, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(h, w, t, chunk_rows=16)
        ref = linear_cross_entropy_reference(h, w, t)
    truth = linear_cross_entropy_reference(h.double(), w.double(), t)
    true_grads = torch.autograd.grad(truth, [h, w])
    assert loss.dtype == torch.float32
    loss_err, ref_err = abs(loss.item() - truth.item()), abs(ref.item() - truth.item())
    assert loss_err <= 1.5 * ref_err + 1e-4
    got, want = torch.autograd.grad(loss, [h, w]), torch.autograd.grad(ref, [h, w])
    for a, b, exact in zip(got, want, true_grads):
        assert a.dtype == torch.float32
        err, err_ref = (a.double() - exact).abs().max(), (b.double() - exact).abs().max()
        # bf16 rounding, and no worse than autocast's own backward through the full logits
        assert err <= 1.5 * err_ref + 1e-6 and err < 0.1 * exact.abs().max()


def test_linear_cross_entropy_under_autocast_casts_the_weight_once():
    """Under autocast the head's weight is cast to bfloat16 once per call, not once per chunk and matmul (autocast
    casts every matmul operand that is not a leaf: here the weight reaches the chunks through an autograd Function
    and as its transpose). Counted as copies of weight-sized tensors, over 4 chunks."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountCasts(TorchDispatchMode):
        def __init__(self, shape):
            super().__init__()
            self.shape, self.count = shape, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
                self.count += args[0].shape in (self.shape, self.shape[::-1])
            return func(*args, **(kwargs or {}))

    h, w, t = ce_inputs(N=64, d=32, V=50, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16), CountCasts(tuple(w.shape)) as casts:
        loss = linear_cross_entropy(h, w, t, chunk_rows=16)
    assert casts.count == 1
    assert torch.isfinite(loss)


def test_linear_cross_entropy_with_bfloat16_weights_is_as_accurate_as_reference():
    """A model cast to bf16 (no autocast): the softmax is still float32, the gradients come back in bf16."""
    h32, w32, t = ce_inputs(N=64, d=32, V=50, dtype=torch.float32)
    h, w = (x.detach().bfloat16().requires_grad_() for x in (h32, w32))
    loss = linear_cross_entropy(h, w, t, chunk_rows=16)
    ref = linear_cross_entropy_reference(h, w, t)
    hd, wd = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    truth = linear_cross_entropy_reference(hd, wd, t)
    true_grads = torch.autograd.grad(truth, [hd, wd])
    assert loss.dtype == torch.float32
    assert abs(loss.item() - truth.item()) <= 1.5 * abs(ref.item() - truth.item()) + 1e-4
    got, want = torch.autograd.grad(loss, [h, w]), torch.autograd.grad(ref, [h, w])
    for a, b, exact in zip(got, want, true_grads):
        assert a.dtype == torch.bfloat16
        err, err_ref = (a.double() - exact).abs().max(), (b.double() - exact).abs().max()
        assert err <= 1.5 * err_ref + 1e-6 and err < 0.1 * exact.abs().max()


def test_linear_cross_entropy_rejects_bad_shapes():
    h, w, t = ce_inputs()
    with pytest.raises(ValueError, match=r"targets must be \[N\] = \[23\]"):
        linear_cross_entropy(h, w, t[:5])
    with pytest.raises(ValueError, match="h must be"):
        linear_cross_entropy(h, w[:, :2], t)
    with pytest.raises(ValueError, match="chunk_rows"):
        linear_cross_entropy(h, w, t, chunk_rows=-1)
    assert default_chunk_rows(8192) == 512 and default_chunk_rows(10**7) == 64


@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_target_logprobs_matches_cross_entropy_and_max(with_weight, dtype):
    from linlm.ops.fused import target_logprobs

    g = torch.Generator().manual_seed(0)
    N, d, V = 37, 16, 50
    h = torch.randn(N, d, generator=g).to(dtype)
    w = (torch.randn(V, d, generator=g) * 0.5).to(dtype) if with_weight else None
    logits = F.linear(h, w) if with_weight else torch.randn(N, V, generator=g).to(dtype)
    src = h if with_weight else logits
    targets = torch.randint(0, V, (N,), generator=g)
    targets[:5] = logits[:5].float().argmax(-1)  # some greedy targets for sure
    ref = -F.cross_entropy(logits.float(), targets, reduction="none")
    ref_greedy = logits.float().gather(1, targets[:, None]).squeeze(1) >= logits.float().amax(-1)
    for rows, cols in ((1, 1), (7, 9), (N, V), (None, None)):  # chunking must not change a thing
        logp, greedy = target_logprobs(src, targets, w, chunk_rows=rows, chunk_cols=cols)
        assert logp.dtype == torch.float32 and torch.equal(greedy, ref_greedy)
        torch.testing.assert_close(logp, ref, rtol=0, atol=1e-5)
    assert bool(greedy[:5].all()) and not bool(greedy.all())
    with pytest.raises(ValueError, match="targets"):
        target_logprobs(src, targets[:-1], w)


def test_target_logprobs_rejects_targets_outside_the_vocabulary():
    from linlm.ops.fused import target_logprobs

    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        target_logprobs(torch.randn(3, 4), torch.tensor([0, 1, 5]), torch.randn(5, 4))


def test_no_grad_calls_give_the_same_bits_as_recorded_ones():
    """Without autograd the wrappers skip the autograd.Function; the values must not change."""
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(2, 5, 3, 2, 8, generator=g, requires_grad=True)
    cos, sin = rope_angles(torch.arange(5), 8, 10000.0, torch.float32)
    h = torch.randn(2, 5, 12, generator=g, requires_grad=True)
    x, w = torch.randn(2, 5, 6, generator=g, requires_grad=True), torch.randn(6, generator=g, requires_grad=True)
    cases = [lambda: rope_qkv(qkv, cos, sin), lambda: glu(h, "silu"), lambda: glu(h, None),
             lambda: rms_norm(x, w, 1e-6), lambda: rms_norm(x, None, 1e-6)]
    for f in cases:
        recorded = f()
        assert recorded.grad_fn is not None
        with torch.no_grad():
            direct = f()
        assert direct.grad_fn is None and torch.equal(direct, recorded.detach())
