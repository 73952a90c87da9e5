"""The mixture-of-SwiGLU-experts MLP: grouped dispatch against a per-token reference, shared experts, aux losses,
active parameters and FLOPs."""

import pytest
import torch
import torch.nn.functional as F

from linlm.layers.glu import GLU
from linlm.layers.moe import MoEMLP, grouped_mm_takes
from linlm.models.counting import active_params, forward_flops_per_token
from linlm.ops.routing import load_balance_loss, router_z_loss


def make(E=4, k=2, h=24, shared=0, d=16, **kw):
    torch.manual_seed(1)
    m = MoEMLP(d, E, k, h, shared, **kw).double()
    with torch.no_grad():
        m.router.weight.copy_(torch.randn(E, d) * 2.0)  # decisive, asymmetric routing
        m.w_in.copy_(torch.randn_like(m.w_in) / 4)
        m.w_out.copy_(torch.randn_like(m.w_out) / 5)
        if m.shared is not None:
            for p in m.shared.parameters():
                p.copy_(torch.randn_like(p) / 4)
    return m


def swiglu(x, w_in, w_out):
    gate, up = (w_in @ x).chunk(2)
    return w_out @ (F.silu(gate) * up)


def moe_reference(m: MoEMLP, x):
    """One token at a time: softmax, top-k, renormalise, sum the chosen experts (plus the shared ones)."""
    flat = x.reshape(-1, m.d_model)
    out = torch.zeros_like(flat)
    for n in range(flat.shape[0]):
        probs = torch.softmax(m.router.weight @ flat[n], dim=-1)
        top, idx = probs.topk(m.top_k)
        top = top / top.sum()
        for g, e in zip(top, idx.tolist()):
            out[n] += g * swiglu(flat[n], m.w_in[e], m.w_out[e])
        if m.shared is not None:
            out[n] += m.shared(flat[n])
    return out.view_as(x)



def assert_matches_reference(m32, x32, y32, m64, x64) -> None:
    """The float32 layer's output ``y32`` and its gradients (input and parameters) against the float64 per-token
    reference of ``m64`` (the same weights), for a random output gradient."""
    y_ref = moe_reference(m64, x64)
    torch.testing.assert_close(y32, y_ref.float(), rtol=1e-5, atol=1e-5)
    w = torch.randn_like(y_ref)
    g32 = torch.autograd.grad((y32 * w.float()).sum(), [x32, *m32.parameters()])
    g64 = torch.autograd.grad((y_ref * w).sum(), [x64, *m64.parameters()])
    for a, b in zip(g32, g64):
        torch.testing.assert_close(a, b.float(), rtol=1e-4, atol=1e-5)

@pytest.mark.parametrize("path", ["batched", "looped"])
@pytest.mark.parametrize("E,k,shared", [(4, 2, 0), (5, 3, 0), (4, 1, 2), (3, 3, 1)])
def test_grouped_dispatch_matches_per_token_reference(E, k, shared, path):
    m = make(E, k, shared=shared)
    m.pad_limit = float("inf") if path == "batched" else 0.0
    x = torch.randn(3, 11, 16, dtype=torch.float64, requires_grad=True)
    y, aux = m(x)
    y_ref = moe_reference(m, x)
    torch.testing.assert_close(y, y_ref)
    w = torch.randn_like(y)
    params = [x, *m.parameters()]
    for g, gr in zip(torch.autograd.grad((y * w).sum(), params), torch.autograd.grad((y_ref * w).sum(), params)):
        torch.testing.assert_close(g, gr)


needs_grouped_mm = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no _grouped_mm")


@needs_grouped_mm
@pytest.mark.parametrize("E,k,shared", [(4, 2, 0), (5, 3, 1), (8, 2, 0)])
def test_grouped_path_matches_the_reference_in_float32(E, k, shared):
    """float32 on the CPU takes the grouped matmul (also with experts that get no token: E=8 for 33 tokens, decisive
    routing); it equals the per-token reference computed in float64, values and gradients."""
    m64 = make(E, k, shared=shared)
    m32 = make(E, k, shared=shared).float()
    taken = []
    original = m32._experts_grouped
    m32._experts_grouped = lambda *a: taken.append(1) or original(*a)
    x64 = torch.randn(3, 11, 16, dtype=torch.float64, requires_grad=True)
    x32 = x64.detach().float().requires_grad_()
    y32, _ = m32(x32)
    assert taken == [1]
    assert_matches_reference(m32, x32, y32, m64, x64)


@needs_grouped_mm
@pytest.mark.parametrize("quantum", [5, 16])
def test_grouped_path_with_groups_padded_to_a_shape_quantum(quantum, monkeypatch):
    """In bfloat16 each expert's group of rows is padded to the matmul shape quantum (routing.matmul_row_quantum,
    so that oneDNN's shapes repeat); forced here in float32, the padded groups give the per-token reference's values
    and gradients (the padding rows get none), with an expert that gets no token (E = 8, 33 tokens)."""
    import linlm.layers.moe as moe_module

    monkeypatch.setattr(moe_module, "matmul_row_quantum", lambda x: quantum)
    m64, m32 = make(8, 2), make(8, 2).float()
    offsets = []
    real = torch._grouped_mm
    monkeypatch.setattr(torch, "_grouped_mm", lambda a, b, offs: offsets.append(offs.clone()) or real(a, b, offs=offs))
    x64 = torch.randn(3, 11, 16, dtype=torch.float64, requires_grad=True)
    x32 = x64.detach().float().requires_grad_()
    y32, _ = m32(x32)
    assert offsets and all(bool((o % quantum == 0).all()) for o in offsets)
    assert int(offsets[0][-1]) > 66  # padding rows beyond the 33 x 2 assignments
    assert_matches_reference(m32, x32, y32, m64, x64)


@needs_grouped_mm
def test_grouped_path_runs_in_autocast_dtype():
    m = make(4, 2).float()
    x = torch.randn(2, 9, 16)
    m.grouped = False
    y_batched, _ = m(x)
    m.grouped = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = m(x)
        h_dtypes = []
        real = torch._grouped_mm
        try:
            torch._grouped_mm = lambda a, b, **kw: h_dtypes.append((a.dtype, b.dtype)) or real(a, b, **kw)
            m(x)
        finally:
            torch._grouped_mm = real
    assert h_dtypes == [(torch.bfloat16, torch.bfloat16)] * 2
    torch.testing.assert_close(y.float(), y_batched, rtol=0.05, atol=0.02)


@needs_grouped_mm
def test_grouped_path_needs_16_byte_rows():
    """Sizes whose rows are not a multiple of 16 bytes (42 floats) take the other paths, with the same result."""
    m = make(4, 2, h=42).float()
    taken = []
    original = m._experts_grouped
    m._experts_grouped = lambda *a: taken.append(1) or original(*a)
    x = torch.randn(2, 9, 16)
    y, _ = m(x)
    assert taken == []
    m.grouped = False
    torch.testing.assert_close(y, m(x)[0])
    assert not grouped_mm_takes(x, 16, 42) and grouped_mm_takes(x, 16, 44)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not grouped_mm_takes(x, 16, 44) and grouped_mm_takes(x, 16, 48)


def swiglu_rows(x, w_in, w_out):
    gate, up = F.linear(x, w_in).chunk(2, -1)
    return F.linear(F.silu(gate) * up, w_out)


def test_shared_experts_are_always_on_swiglus():
    h = 8
    m = make(E=4, k=2, h=h, shared=2)
    routed = make(E=4, k=2, h=h, shared=0)
    routed.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("shared.")})
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        # The fused shared GLU of width 2h is two SwiGLUs of width h, split along the hidden units.
        gate, up = m.shared.w_in.weight.chunk(2)
        w_out = m.shared.w_out.weight
        parts = sum(
            swiglu_rows(x, torch.cat([gate[i * h : (i + 1) * h], up[i * h : (i + 1) * h]]), w_out[:, i * h : (i + 1) * h])
            for i in range(2)
        )
        torch.testing.assert_close(m(x)[0], routed(x)[0] + parts)


def test_path_choice_follows_padding_cost(monkeypatch):
    m = make(E=4, k=1)
    x = torch.randn(1, 64, 16, dtype=torch.float64)
    with torch.no_grad():
        m.router.weight.zero_()
        m.router.weight[2, 0] = 50.0  # every token with x[..., 0] > 0 goes to expert 2: about 2x the mean load
    taken = []
    for name in ("_experts_batched", "_experts_looped"):
        original = getattr(m, name)
        monkeypatch.setattr(m, name, lambda *a, _f=original, _n=name: taken.append(_n) or _f(*a))
    y_loop = m(x)[0]
    m.pad_limit = 4.0
    y_batch = m(x)[0]
    assert taken == ["_experts_looped", "_experts_batched"]
    torch.testing.assert_close(y_batch, y_loop)


def test_single_expert_equals_dense_swiglu():
    m = make(E=1, k=1, h=24)
    glu = GLU(16, 24).double()
    with torch.no_grad():
        glu.w_in.weight.copy_(m.w_in[0])
        glu.w_out.weight.copy_(m.w_out[0])
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    y, aux = m(x)
    torch.testing.assert_close(y, glu(x), rtol=1e-12, atol=1e-12)
    assert aux.item() == pytest.approx(0.01)  # one expert: the Switch loss is exactly 1.0


def test_every_token_uses_exactly_its_top_k_experts():
    m = make(E=6, k=2)
    x = torch.randn(1, 40, 16, dtype=torch.float64)
    idx = (x[0] @ m.router.weight.T).topk(2, dim=-1).indices
    base = m(x)[0]
    for e in range(6):
        with torch.no_grad():
            before = m.w_out[e].clone()
            m.w_out[e] += 1.0
            moved = (m(x)[0] - base)[0].abs().amax(-1) > 0
            m.w_out[e] = before
        assert torch.equal(moved, (idx == e).any(-1)), e


def test_aux_loss_is_weighted_balance_plus_z_loss():
    m = make(E=4, k=2, balance_coef=0.03, z_coef=0.002)
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    logits = x.reshape(-1, 16) @ m.router.weight.T
    probs = torch.softmax(logits, -1)
    idx = probs.topk(2, -1).indices
    want = 0.03 * load_balance_loss(probs, idx, 4) + 0.002 * router_z_loss(logits)
    _, aux = m(x)
    torch.testing.assert_close(aux, want)
    aux.backward()
    assert m.router.weight.grad.abs().sum() > 0  # the balance loss trains the router


def test_active_params_and_flops():
    d, E, k, h, S = 16, 8, 2, 24, 1
    m = MoEMLP(d, E, k, h, S)
    per_expert = 3 * d * h
    assert active_params(m) == d * E + S * per_expert + k * per_expert
    assert sum(p.numel() for p in m.parameters()) == d * E + (S + E) * per_expert
    assert forward_flops_per_token(m, 128) == 2 * d * E + k * (2 * per_expert + 2 * d) + S * 2 * per_expert


def test_a_gated_shared_expert_of_its_own_width_is_scaled_per_token():
    """shared_dim gives the shared SwiGLU its own width; shared_gate scales its output per token by sigmoid(x w)
    (Qwen3-Next's shared expert); the gate counts in the active parameters and the FLOPs."""
    d, E, k, h, hs = 16, 4, 2, 8, 12
    m = make(E=E, k=k, h=h, shared_dim=hs, shared_gate=True)
    routed = make(E=E, k=k, h=h)
    routed.load_state_dict({n: v for n, v in m.state_dict().items() if not n.startswith("shared")})
    assert m.shared.hidden == hs and m.shared_gate.weight.shape == (1, d)
    x = torch.randn(2, 5, d, dtype=torch.float64)
    with torch.no_grad():
        m.shared_gate.weight.copy_(torch.randn(1, d))
        scale = torch.sigmoid(x @ m.shared_gate.weight.T)
        want = routed(x)[0] + scale * m.shared(x)
        torch.testing.assert_close(m(x)[0], want)
        assert scale.std() > 0.05  # the scale differs between tokens: a per-token gate, not a constant
    ungated = make(E=E, k=k, h=h, shared_dim=hs)
    assert active_params(m) == active_params(ungated) + d
    assert forward_flops_per_token(m, 16) == forward_flops_per_token(ungated, 16) + 2 * d
