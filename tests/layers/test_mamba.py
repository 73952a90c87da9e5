"""The Mamba-1 block: its conv, its fast forward against a from-the-equations reference, decoding, packing, init."""


import pytest
import torch
import torch.nn.functional as F

from linlm import create_model
from ssm_helpers import assert_near_in_norm, bf16_outputs_and_grads, randomize_, spy_kernel_scan
from linlm.layers.mamba import DT_MAX, DT_MIN, MambaMixer, ShortConv
from linlm.models.presets import preset_config
from linlm.ops.selective_scan import selective_scan_reference


def mixer(**kw):
    cfg = preset_config("mamba", "tiny", **kw)
    return randomize_(MambaMixer(cfg, 0)).double()


def docs_reset(lengths, batch=1):
    reset = torch.zeros(batch, sum(lengths), dtype=torch.bool)
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
    reset[:, starts] = True
    return reset


def mamba_reference(m: MambaMixer, x):
    """The block written from its equations: nn.functional.conv1d and the scan's sequential definition."""
    T = x.shape[1]
    u, z = m.in_proj(x).chunk(2, dim=-1)
    K = m.conv.kernel
    u = F.conv1d(u.transpose(1, 2), m.conv.weight[:, None, :], m.conv.bias, padding=K - 1, groups=u.shape[-1])
    u = F.silu(u[..., :T].transpose(1, 2))
    dt_low, B, C = m.x_proj(u).split([m.dt_rank, m.d_state, m.d_state], dim=-1)
    dt = F.softplus(dt_low @ m.dt_weight.T + m.dt_bias)
    y, s = selective_scan_reference(u, dt, -torch.exp(m.A_log), B, C, m.D)
    return m.out_proj(y * F.silu(z)), s


# ------------------------------------------------------------------------------------------------ ShortConv
def test_short_conv_matches_conv1d():
    conv = randomize_(ShortConv(6, 4)).double()
    x = torch.randn(2, 11, 6, dtype=torch.float64)
    want = F.conv1d(x.transpose(1, 2), conv.weight[:, None], conv.bias, padding=3, groups=6)[..., :11].transpose(1, 2)
    got, state = conv(x)
    torch.testing.assert_close(got, want)
    assert torch.equal(state, x[:, -3:])


@pytest.mark.parametrize("split", [1, 2, 5])
def test_short_conv_state_joins_new_inputs(split):
    conv = randomize_(ShortConv(5, 4)).double()
    x = torch.randn(2, 9, 5, dtype=torch.float64)
    full, _ = conv(x)
    a, s = conv(x[:, :split])
    b, _ = conv(x[:, split:], s)
    torch.testing.assert_close(torch.cat([a, b], 1), full)


def test_short_conv_masks_taps_across_documents_and_clears_stale_state():
    conv = randomize_(ShortConv(3, 4)).double()
    lengths = [5, 2, 1, 6]
    x = torch.randn(1, sum(lengths), 3, dtype=torch.float64)
    prior = torch.randn(1, 3, 3, dtype=torch.float64)  # a state from before: must not reach a new document
    got, _ = conv(x, prior, docs_reset(lengths))
    want = torch.cat([conv(d)[0] for d in x.split(lengths, dim=1)], 1)
    torch.testing.assert_close(got, want)
    # The returned state after a packed call holds only the last document's inputs (2 of 3 slots here).
    short = [4, 2]
    _, state = conv(x[:, :6], None, docs_reset(short))
    assert torch.equal(state[:, 0], torch.zeros(1, 3, dtype=torch.float64))
    assert torch.equal(state[:, 1:], x[:, 4:6])


# ------------------------------------------------------------------------------------------------ the block
@pytest.mark.parametrize("T", [1, 7, 37])
def test_forward_matches_reference_outputs_and_gradients(T):
    m = mixer()
    x = torch.randn(2, T, 64, dtype=torch.float64, requires_grad=True)
    y, st = m(x, return_state=True)
    y_ref, s_ref = mamba_reference(m, x)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(st["ssm"], s_ref)
    w = torch.randn_like(y)
    grads = torch.autograd.grad((y * w).sum(), [x, *m.parameters()])
    grads_ref = torch.autograd.grad((y_ref * w).sum(), [x, *m.parameters()])
    for (name, _), g, gr in zip([("x", None), *m.named_parameters()], grads, grads_ref):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g, gr, msg=name)


def test_prefill_then_steps_and_chunks_match_full_pass():
    m = mixer()
    x = torch.randn(2, 30, 64, dtype=torch.float64)
    with torch.no_grad():
        full, _ = m(x)
        a, s = m(x[:, :9], return_state=True)
        b, s = m(x[:, 9:20], state=s, return_state=True)  # prefill with a state: the conv state joins new inputs
        outs = [a, b]
        for t in range(20, 30):
            o, s = m(x[:, t : t + 1], state=s, return_state=True)  # the one-step form
            outs.append(o)
    torch.testing.assert_close(torch.cat(outs, 1), full)
    assert s["conv"].shape == (2, 3, 128) and s["ssm"].shape == (2, 128, 16)


def test_packed_documents_do_not_leak_and_state_continues_last_document():
    m = mixer()
    lengths = [7, 1, 12]
    x = torch.randn(1, sum(lengths), 64, dtype=torch.float64)
    more = torch.randn(1, 5, 64, dtype=torch.float64)
    with torch.no_grad():
        prior = m(torch.randn(1, 4, 64, dtype=torch.float64), return_state=True)[1]  # stale state: must be dropped
        got, s = m(x, state=prior, reset=docs_reset(lengths), return_state=True)
        want = torch.cat([m(d)[0] for d in x.split(lengths, dim=1)], 1)
        torch.testing.assert_close(got, want)
        cont = m(more, state=s)[0]
        last = x[:, -lengths[-1]:]
        torch.testing.assert_close(cont, m(torch.cat([last, more], 1))[0][:, -5:])


def test_mamba_init_survives_model_reset():
    model = create_model("mamba", preset="tiny")
    mix = model.layers[0].mixer
    dt = F.softplus(mix.dt_bias)
    assert DT_MIN * 0.99 <= dt.min() and dt.max() <= DT_MAX * 1.01
    assert dt.std() > 0  # log-uniform, not a constant left by a zero bias
    A = -torch.exp(mix.A_log)
    torch.testing.assert_close(A, -torch.arange(1, 17.0).expand(128, 16))
    assert torch.equal(mix.D, torch.ones(128))
    bound = mix.dt_rank**-0.5
    assert mix.dt_weight.abs().max() <= bound and mix.dt_weight.std() > bound / 4
    assert model.spec.mlp is None and model.layers[0].mlp is None


def test_presets_match_llama_active_size_and_paper_70m_builds():
    from linlm.models.counting import count_preset

    for preset in ("paper-70m", "paper-160m", "paper-410m", "paper-1b", "paper-3b", "paper-7b"):
        want = count_preset("llama", preset)["non_embedding_params"]
        got = count_preset("mamba", preset)["active_non_embedding_params"]
        assert abs(got - want) / want < 0.02, (preset, got, want)
    model = create_model("mamba", preset="paper-70m", vocab_size=8192)
    assert model.config.n_layers == 12 and model.config.d_model == 512


@pytest.mark.parametrize("batched", [False, True])
def test_dt_preactivation_gradients_equal_the_composite(batched):
    """dt_preactivation's own backward (the rank-R products computed transposed) against autograd of the composite
    bias + dt_low @ W^T: one weight [Din, R] on [B, T, R] (Mamba) and one per expert [E, Din, R] on [E, L, R]
    (MossNet), dt_low a strided slice of a wider projection as in the models; a float64 gradcheck too."""
    from linlm.layers.mamba import dt_preactivation

    torch.manual_seed(5)
    lead, w_shape, b_shape = ((3, 7), (11, 4), (11,)) if not batched else ((3, 7), (3, 11, 4), (3, 11))
    proj = torch.randn(*lead, 9, dtype=torch.float64)
    W, b = torch.randn(w_shape, dtype=torch.float64), torch.randn(b_shape, dtype=torch.float64)
    g = torch.randn(*lead, 11, dtype=torch.float64)
    grads = []
    for fn in (dt_preactivation,
               lambda lo, W, b: (lo @ W.transpose(-1, -2)) + (b if not batched else b.unsqueeze(-2))):
        leaves = [t.clone().requires_grad_(True) for t in (proj, W, b)]
        out = fn(leaves[0][..., 2:6], leaves[1], leaves[2])
        (out * g).sum().backward()
        grads.append([out] + [t.grad for t in leaves])
    assert type(grads[0][0].grad_fn).__name__ == "_LowRankDtBackward"  # rank 4 < NARROW_RANK: its own backward
    for a, c in zip(*grads):
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)
    leaves = [t.clone().requires_grad_(True) for t in (proj, W, b)]
    assert torch.autograd.gradcheck(lambda p, W, b: dt_preactivation(p[..., 2:6], W, b), leaves)
    with torch.no_grad():  # inference takes the plain product (no autograd Function)
        torch.testing.assert_close(dt_preactivation(proj[..., 2:6], W, b), grads[0][0].detach())


def test_dt_preactivation_takes_autograd_at_a_wide_rank():
    """At a rank of NARROW_RANK or more the plain product runs (autograd's backward), with the same values."""
    from linlm.layers.mamba import NARROW_RANK, dt_preactivation

    torch.manual_seed(6)
    R = NARROW_RANK
    low = torch.randn(2, 5, R, dtype=torch.float64, requires_grad=True)
    W, b = torch.randn(7, R, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    out = dt_preactivation(low, W, b)
    assert type(out.grad_fn).__name__ != "_LowRankDtBackward"
    torch.testing.assert_close(out, low @ W.T + b, rtol=1e-12, atol=1e-12)


def test_bfloat16_autocast_keeps_the_activations_in_bfloat16(monkeypatch):
    """Under bf16 autocast the conv, the scan (u bfloat16) and the gate run their bf16 variants, and the block gives
    what converting around the float32 kernels gives (the kernels' bf16 dtypes switched off), output and every
    gradient within bf16 rounding (2 %, relative Frobenius norm; measured up to 0.7 %), with documents."""
    from linlm.ops import kernel_library

    if not kernel_library.available():
        pytest.skip("no C compiler: the kernels are not built")
    cfg = preset_config("mamba", "tiny")
    m = randomize_(MambaMixer(cfg, 0))
    x = torch.randn(2, 50, cfg.d_model, generator=torch.Generator().manual_seed(2))
    reset = docs_reset([20, 30], batch=2)
    w = torch.randn(2, 50, cfg.d_model, generator=torch.Generator().manual_seed(3))
    scan_u = spy_kernel_scan(monkeypatch)

    def run():
        return bf16_outputs_and_grads(m, x, w, lambda xl: (m(xl, reset=reset)[0], 0.0))

    got = run()
    monkeypatch.setattr(kernel_library, "IO_DTYPES", (torch.float32, torch.float64))
    want = run()
    assert scan_u == [torch.bfloat16, torch.float32]
    assert_near_in_norm(m, got, want, 0.02)
