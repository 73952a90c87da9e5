"""Mamba-2, GLA and RetNet: each mixer against a float64 loop written from its paper's equations, the full pass
against one-token decoding, and the parameter and FLOP counts against hand counts."""

import math

import pytest
import torch
import torch.nn.functional as F

from linlm import create_model
from linlm.layers.retnet import retnet_log_decay
from linlm.models.measure import forward_flops_per_token

ARCHS = ["mamba2", "gla", "retnet"]
SMALL = dict(d_model=32, n_heads=2, n_layers=1, chunk_size=4, vocab_size=64)
MAMBA2 = dict(options=dict(head_dim=16, d_state=8, n_groups=2))


def _mixer(arch, **kw):
    model = create_model(arch, preset="tiny", **{**SMALL, **(MAMBA2 if arch == "mamba2" else {}), **kw})
    return model.double().layers[0].mixer


def _rms(x, w, eps, groups=1):
    h = x.reshape(*x.shape[:-1], groups, x.shape[-1] // groups)
    h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h.reshape(x.shape) * w


def mamba2_reference(m, x):
    """h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t^T, y_t = h_t^T C_t + D u_t, per head, one token at a time."""
    Bsz, T, _ = x.shape
    Din, H, P, G, N = m.d_inner, m.n_heads, m.head_dim, m.n_groups, m.d_state
    z, xbc, dt = (x @ m.in_proj.weight.T).split([Din, m.conv_dim, H], dim=-1)
    K = m.conv1d.kernel
    pad = torch.cat([xbc.new_zeros(Bsz, K - 1, m.conv_dim), xbc], dim=1)
    conv = torch.stack([(pad[:, t:t + K] * m.conv1d.weight.T).sum(1) for t in range(T)], 1) + m.conv1d.bias
    u, b, c = F.silu(conv).split([Din, G * N, G * N], dim=-1)
    dt = F.softplus(dt + m.dt_bias)
    A = -torch.exp(m.A_log)
    h = x.new_zeros(Bsz, H, N, P)
    ys = []
    for t in range(T):
        y = x.new_zeros(Bsz, H, P)
        for head in range(H):
            g = head // (H // G)
            ut = u[:, t, head * P:(head + 1) * P]
            bt, ct = b[:, t, g * N:(g + 1) * N], c[:, t, g * N:(g + 1) * N]
            h[:, head] = (torch.exp(dt[:, t, head] * A[head])[:, None, None] * h[:, head]
                          + dt[:, t, head][:, None, None] * bt[:, :, None] * ut[:, None, :])
            y[:, head] = torch.einsum("bnp,bn->bp", h[:, head], ct) + m.D[head] * ut
        ys.append(y.reshape(Bsz, Din))
    y = torch.stack(ys, 1) * F.silu(z)
    return _rms(y, m.norm.weight, m.norm.eps, G) @ m.out_proj.weight.T


def _gated_output(m, o, x):
    """W_o (RMSNorm per head(o) * silu(x W_g)), o [B, T, H, V]."""
    Bsz, T, H, V = o.shape
    y = _rms(o, m.g_norm.weight, m.g_norm.eps) * F.silu(x @ m.g_proj.weight.T).view(Bsz, T, H, V)
    return y.reshape(Bsz, T, H * V) @ m.o_proj.weight.T


def gla_reference(m, x):
    """S_t = Diag(alpha_t) S_{t-1} + k_t v_t^T with alpha_t = sigmoid(x W1 W2 + b)^(1/tau), o_t = S_t^T q_t / sqrt(K)."""
    Bsz, T, _ = x.shape
    H, K, V = m.n_heads, m.k_dim, m.v_dim
    q = (x @ m.q_proj.weight.T).view(Bsz, T, H, K)
    k = (x @ m.k_proj.weight.T).view(Bsz, T, H, K)
    v = (x @ m.v_proj.weight.T).view(Bsz, T, H, V)
    gate = m.gk_proj
    alpha = torch.sigmoid(x @ gate.down.weight.T @ gate.up.weight.T + gate.up.bias) ** (1 / gate.tau)
    alpha = alpha.view(Bsz, T, H, K)
    S = x.new_zeros(Bsz, H, K, V)
    outs = []
    for t in range(T):
        S = alpha[:, t, :, :, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]) / math.sqrt(K))
    return _gated_output(m, torch.stack(outs, 1), x)


def _rotate(x, pos, theta):
    """RoPE on [B, T, H, D], halves paired: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    D = x.shape[-1]
    freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = pos[:, None].double() * freq[None]
    cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def retnet_reference(m, x):
    """Retention in its parallel form: o_t = sum_{s <= t} gamma^(t - s) (q_t . k_s) v_s, q and k rotated."""
    Bsz, T, _ = x.shape
    H, K, V = m.n_heads, m.k_dim, m.v_dim
    pos = torch.arange(T)
    q = _rotate((x @ m.q_proj.weight.T).view(Bsz, T, H, K), pos, m.rope_theta) / math.sqrt(K)
    k = _rotate((x @ m.k_proj.weight.T).view(Bsz, T, H, K), pos, m.rope_theta)
    v = (x @ m.v_proj.weight.T).view(Bsz, T, H, V)
    gamma = 1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float64))
    dist = (pos[:, None] - pos[None, :]).double()
    decay = torch.where(dist >= 0, gamma[:, None, None] ** dist.clamp_min(0), 0.0)  # [H, T, T]
    scores = torch.einsum("bthk,bshk->bhts", q, k) * decay
    return _gated_output(m, torch.einsum("bhts,bshv->bthv", scores, v), x)


REFERENCES = {"mamba2": mamba2_reference, "gla": gla_reference, "retnet": retnet_reference}


@pytest.mark.parametrize("arch", ARCHS)
def test_full_pass_equals_float64_reference_of_the_equations(arch):
    m = _mixer(arch)
    with torch.no_grad():
        if arch == "gla":  # gates spread over (0, 1), not all near 1
            m.gk_proj.up.bias.uniform_(-4, 4)
        x = torch.randn(2, 11, SMALL["d_model"], dtype=torch.float64)
        got, _ = m(x)
        want = REFERENCES[arch](m, x)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("arch", ARCHS)
def test_chunk_form_step_form_and_split_prefill_agree(arch):
    """The chunkwise full pass, a prefill continued by one-token steps, and a prefill in two pieces."""
    m = _mixer(arch)
    x = torch.randn(2, 13, SMALL["d_model"], dtype=torch.float64)
    with torch.no_grad():
        full, _ = m(x)
        y, state = m(x[:, :5], return_state=True)
        steps = [y]
        for t in range(5, 13):
            y, state = m(x[:, t:t + 1], state=state, offset=t, return_state=True)
            steps.append(y)
        a, s = m(x[:, :6], return_state=True)
        b, _ = m(x[:, 6:], state=s, offset=6)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.cat([a, b], 1), full, rtol=1e-10, atol=1e-12)


def test_parameter_counts_by_hand():
    d, H = 32, 2
    # Mamba-2: Din = 64, P = 16 -> H = 4 heads, G = 2, N = 8; conv over Din + 2 G N = 96 channels, kernel 4.
    m = _mixer("mamba2")
    Din, Hm, conv = 64, 4, 96
    assert sum(p.numel() for p in m.parameters()) == d * (Din + conv + Hm) + conv * 4 + conv + 3 * Hm + Din + Din * d
    # GLA: q, k of d/2, v and g of d, o; the gate's rank-16 down and up (with bias); the norm per head of V = 16.
    g = _mixer("gla")
    assert sum(p.numel() for p in g.parameters()) == 2 * d * d // 2 + 3 * d * d + d * 16 + 16 * d // 2 + d // 2 + 16
    # RetNet: q, k of d, v and g of 2 d, o from 2 d; the norm per head of V = 2 d / H = 32.
    r = _mixer("retnet")
    assert sum(p.numel() for p in r.parameters()) == 2 * d * d + 3 * 2 * d * d + 2 * d // H
    assert retnet_log_decay(2, torch.float64).tolist() == pytest.approx([math.log(1 - 2 ** -5), math.log(1 - 2 ** -6)],
                                                                         rel=1e-15)


def test_flop_hooks_by_hand():
    d, C = 32, 4  # chunk_size 4
    # The GLA op per token: H (2 C (K + V) + 4 K V); with q and k shared by G groups, G 2 C K + H (2 C V + 4 K V).
    m = _mixer("mamba2")  # H = 4, G = 2, K = N = 8, V = P = 16; linear layers in_proj and out_proj; conv 2 * 96 * 4
    op = 2 * 2 * C * 8 + 4 * (2 * C * 16 + 4 * 8 * 16)
    assert forward_flops_per_token(m, 100) == 2 * d * 164 + 2 * 64 * d + 2 * 96 * 4 + 4 * 64 + op + 6 * 64
    g = _mixer("gla")  # H = 2, K = 8, V = 16
    op = 2 * (2 * C * (8 + 16) + 4 * 8 * 16)
    linear = 2 * (2 * d * 16 + 3 * d * 32 + d * 16 + 16 * 16)
    assert forward_flops_per_token(g, 100) == linear + op + 2 * (3 * 8 + 4 * 16)
    r = _mixer("retnet")  # H = 2, K = 16, V = 32
    op = 2 * (2 * C * (16 + 32) + 4 * 16 * 32)
    linear = 2 * (2 * d * d + 3 * d * 64)
    assert forward_flops_per_token(r, 100) == linear + op + 2 * (7 * 16 + 4 * 32)
