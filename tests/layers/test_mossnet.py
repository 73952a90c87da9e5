"""MossNet's time mixer: the batched expert scan against a per-token reference, routing invariants, decoding,
packing, the reduction to Mamba + MLP, presets and bad configs."""


import pytest
import torch
import torch.nn.functional as F

from linlm import create_model
from ssm_helpers import assert_near_in_norm, bf16_outputs_and_grads, randomize_, spy_kernel_scan
from linlm.errors import ConfigError
from linlm.layers.mamba import MambaMixer
from linlm.layers.mossnet import MossNetMixer
from linlm.ops import kernel_library, scan_kernel
from linlm.models.counting import count_preset
from linlm.models.presets import preset_config

VARIANTS = [(p, k) for p in ("routed", "dense") for k in ("s6", "ssd")]


def mixer(policy="routed", kernel="s6", dtype=torch.float64, **kw):
    cfg = preset_config("mossnet", "tiny", ssm_policy=policy, ssm_kernel=kernel, **kw)
    return randomize_(MossNetMixer(cfg, 0)).to(dtype)


def route(m, x):
    probs = torch.softmax(m.router(x).double(), dim=-1)
    top, idx = probs.topk(m.top_k, dim=-1)
    return top / top.sum(-1, keepdim=True), idx


@pytest.fixture
def poisoned_memory():
    """Deterministic mode fills uninitialised memory (torch.empty) with NaN: a buffer left unwritten shows up."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


@pytest.fixture
def one_thread():
    """One thread, so that training's packed layout runs (more threads than E x channel tiles take the per-row one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def docs_reset(lengths, batch=1):
    reset = torch.zeros(batch, sum(lengths), dtype=torch.bool)
    reset[:, torch.tensor([0] + lengths[:-1]).cumsum(0)] = True
    return reset


def mossnet_reference(m: MossNetMixer, x):
    """Per token, per row, per expert: the math of the docstring, written out with nothing batched."""
    Bt, T, _ = x.shape
    E, N, Din, R = m.n_experts, m.d_state, m.d_inner, m.dt_rank
    gates, idx = route(m, x)
    u, z = m.in_proj(x).chunk(2, dim=-1)
    K = m.conv.kernel
    u = F.conv1d(u.transpose(1, 2), m.conv.weight[:, None, :], m.conv.bias, padding=K - 1, groups=Din)
    u = F.silu(u[..., :T].transpose(1, 2))
    Wx = m.x_proj.weight.view(E, R + 2 * N, Din)
    shape = (Din, N) if m.kernel == "s6" else (N, Din)
    states = [[torch.zeros(shape, dtype=x.dtype) for _ in range(E)] for _ in range(Bt)]
    y = torch.zeros(Bt, T, Din, dtype=x.dtype)
    for b in range(Bt):
        for t in range(T):
            ut = u[b, t]
            chosen = idx[b, t].tolist()
            for e in range(E):
                if m.policy == "routed" and e not in chosen:
                    continue  # an unselected expert's state does not move
                p = Wx[e] @ ut
                dt_low, Bv, Cv = p[:R], p[R : R + N], p[R + N :]
                s = states[b][e]
                if m.kernel == "s6":
                    dt = F.softplus(m.dt_weight[e] @ dt_low + m.dt_bias[e])  # [Din]
                    A = -torch.exp(m.A_log[e])  # [Din, N]
                    s = torch.exp(dt[:, None] * A) * s + (dt * ut)[:, None] * Bv[None, :]
                    ye = s @ Cv + m.D[e] * ut
                else:
                    dt = F.softplus(dt_low[0] + m.dt_bias[e])  # a scalar
                    s = torch.exp(dt * -torch.exp(m.A_log[e])) * s + dt * Bv[:, None] * ut[None, :]
                    ye = Cv @ s + m.D[e] * ut
                states[b][e] = s
                if e in chosen:
                    y[b, t] += gates[b, t, chosen.index(e)] * ye
    out = m.out_proj(y * F.silu(z))
    return out, torch.stack([torch.stack(row) for row in states])


# ------------------------------------------------------------------------------------------------ forms
@pytest.mark.parametrize("policy,kernel", VARIANTS)
def test_batched_expert_scan_matches_per_token_reference(policy, kernel, poisoned_memory, one_thread):
    m = mixer(policy, kernel)
    x = torch.randn(2, 21, 64, dtype=torch.float64)
    with torch.no_grad():
        y, state, aux = m(x, return_state=True)  # one expert row per (expert, batch row)
        y_packed, _, _ = m(x)  # no state in or out: one row per expert, the batch rows packed in it
        y_ref, s_ref = mossnet_reference(m, x)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(y_packed, y_ref)
    torch.testing.assert_close(state["ssm"], s_ref)
    assert aux.dim() == 0 and torch.isfinite(aux)


@pytest.mark.parametrize("policy,kernel", VARIANTS)
def test_gradients_match_reference(policy, kernel, one_thread):
    m = mixer(policy, kernel)
    x = torch.randn(2, 13, 64, dtype=torch.float64, requires_grad=True)  # 2 rows: the packed layout's resets
    w = torch.randn(2, 13, 64, dtype=torch.float64)
    y, _, _ = m(x)
    y_ref, _ = mossnet_reference(m, x)
    names, params = zip(*m.named_parameters())
    grads = torch.autograd.grad((y * w).sum(), [x, *params])
    grads_ref = torch.autograd.grad((y_ref * w).sum(), [x, *params])
    for name, g, gr in zip(["x", *names], grads, grads_ref):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g, gr, msg=lambda s, name=name: f"{name}: {s}")


def test_ssd_kernel_equals_s6_with_scalar_decay():
    """S6 with dt_rank 1, a dt_proj of ones and A constant over (channel, state) is the SSD expert."""
    s6 = mixer("routed", "s6", dt_rank=1)
    ssd = mixer("routed", "ssd", dt_rank=1)
    with torch.no_grad():
        for name in ("in_proj.weight", "conv.weight", "conv.bias", "router.weight", "x_proj.weight", "D",
                     "out_proj.weight"):
            ssd.get_parameter(name).copy_(s6.get_parameter(name))
        s6.dt_weight.fill_(1.0)
        s6.dt_bias.copy_(ssd.dt_bias[:, None].expand_as(s6.dt_bias))
        s6.A_log.copy_(ssd.A_log[:, None, None].expand_as(s6.A_log))
    x = torch.randn(2, 19, 64, dtype=torch.float64)
    with torch.no_grad():
        y6, s6_state, _ = s6(x, return_state=True)
        yd, sd_state, _ = ssd(x, return_state=True)
    torch.testing.assert_close(yd, y6)
    torch.testing.assert_close(sd_state["ssm"], s6_state["ssm"].transpose(-1, -2))  # [N, Din] vs [Din, N]


# ------------------------------------------------------------------------------------------------ routing
def test_routed_expert_parameters_only_reach_its_tokens():
    m = mixer("routed", "s6")
    x = torch.randn(2, 25, 64, dtype=torch.float64)
    _, idx = route(m, x)
    with torch.no_grad():
        base = m(x)[0]
        for e in range(m.n_experts):
            before = m.D[e].clone()
            m.D[e] += 1.0
            moved = (m(x)[0] - base).abs().amax(-1) > 0
            m.D[e] = before
            uses = (idx == e).any(-1)
            assert 0 < uses.sum() < uses.numel(), "pick a routing where each expert is used by some tokens only"
            assert torch.equal(moved, uses), e


def test_dense_expert_state_sees_every_token():
    """Dense: an expert not picked at t still advances on t, so changing its B projection moves later outputs."""
    m = mixer("dense", "s6")
    x = torch.randn(1, 25, 64, dtype=torch.float64)
    _, idx = route(m, x)
    with torch.no_grad():
        base, s0, _ = m(x, return_state=True)
        e = 0
        m.x_proj.weight.view(m.n_experts, -1, 128)[e, m.dt_rank] += 0.5  # first B row of expert 0
        y, s1, _ = m(x, return_state=True)
    uses = (idx[0] == e).any(-1)
    moved = (y - base)[0].abs().amax(-1) > 0
    assert torch.equal(moved, uses)  # outputs are gated...
    assert not torch.equal(s0["ssm"][:, e], s1["ssm"][:, e])  # ...but the state moved on every token
    assert torch.equal(s0["ssm"][:, 1:], s1["ssm"][:, 1:])


def test_aux_losses_reach_the_model_output():
    ids = torch.randint(0, 512, (2, 30))
    outs = {}
    for coef, z in ((0.0, 0.0), (0.01, 0.0), (0.02, 0.0), (0.01, 1e-3)):
        torch.manual_seed(0)
        model = create_model("mossnet", preset="tiny", balance_loss_coef=coef, router_z_loss_coef=z)
        outs[coef, z] = model(ids, return_aux=True).aux_loss
    assert outs[0.0, 0.0] == 0
    # 2 layers x 2 routers of Switch losses (each >= 0 and 1.0 when balanced), linear in the coefficient.
    per = outs[0.01, 0.0] / 0.01
    assert 2.0 < per < 8.0
    torch.testing.assert_close(outs[0.02, 0.0], 2 * outs[0.01, 0.0])
    assert outs[0.01, 1e-3] > outs[0.01, 0.0]


# ------------------------------------------------------------------------------------------------ decoding
@pytest.mark.parametrize("policy,kernel", VARIANTS)
def test_prefill_then_steps_match_full_pass(policy, kernel):
    model = create_model("mossnet", preset="tiny", ssm_policy=policy, ssm_kernel=kernel).eval()
    randomize_(model)
    ids = torch.randint(0, 512, (2, 40))
    with torch.no_grad():
        full = model(ids)
        a = model(ids[:, :11], return_state=True)
        b = model(ids[:, 11:25], state=a.state, return_state=True)  # a prefill that continues a state
        outs, state = [a.logits, b.logits], b.state
        for t in range(25, 40):
            o = model(ids[:, t : t + 1], state=state, return_state=True)
            outs.append(o.logits)
            state = o.state
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", ["s6", "ssd"])
def test_routed_step_updates_only_the_selected_experts(kernel):
    m = mixer("routed", kernel)
    x = torch.randn(3, 9, 64, dtype=torch.float64)
    nxt = torch.randn(3, 1, 64, dtype=torch.float64)
    with torch.no_grad():
        _, state, _ = m(x, return_state=True)
        _, new, _ = m(nxt, state=state, return_state=True)
    _, idx = route(m, nxt)
    for b in range(3):
        for e in range(m.n_experts):
            same = torch.equal(new["ssm"][b, e], state["ssm"][b, e])
            assert same == (e not in idx[b, 0].tolist()), (b, e)


def test_dense_step_updates_every_expert():
    m = mixer("dense", "ssd")
    with torch.no_grad():
        _, state, _ = m(torch.randn(2, 5, 64, dtype=torch.float64), return_state=True)
        _, new, _ = m(torch.randn(2, 1, 64, dtype=torch.float64), state=state, return_state=True)
    for e in range(m.n_experts):
        assert not torch.equal(new["ssm"][:, e], state["ssm"][:, e])


@pytest.mark.parametrize("policy,kernel", VARIANTS)
def test_packed_documents_match_separate_runs_and_continue(policy, kernel, poisoned_memory):
    """Packed rows equal documents run alone; the state returned after a packed call continues the last document
    only (a routed expert that saw nothing of it must not carry an older document's state)."""
    m = mixer(policy, kernel)
    lengths = [9, 1, 3, 6]
    x = torch.randn(1, sum(lengths), 64, dtype=torch.float64)
    more = torch.randn(1, 6, 64, dtype=torch.float64)
    with torch.no_grad():
        prior = m(torch.randn(1, 5, 64, dtype=torch.float64), return_state=True)[1]
        got, s, _ = m(x, state=prior, reset=docs_reset(lengths), return_state=True)
        want = torch.cat([m(d)[0] for d in x.split(lengths, dim=1)], 1)
        torch.testing.assert_close(got, want)
        last = x[:, -lengths[-1]:]
        _, s_last, _ = m(last, return_state=True)
        torch.testing.assert_close(s["ssm"], s_last["ssm"])
        torch.testing.assert_close(m(more, state=s)[0], m(torch.cat([last, more], 1))[0][:, -6:])


@pytest.mark.parametrize("policy,kernel", VARIANTS)
def test_packed_batch_with_documents_matches_per_row_layout(policy, kernel, one_thread):
    """Training's layout (a row per expert, batch rows and documents one after the other) against the per-row one
    that a returned state uses: outputs and every gradient."""
    m = mixer(policy, kernel)
    assert m._rows_keep_threads_busy(torch.zeros(1))
    x = torch.randn(3, 17, 64, dtype=torch.float64, requires_grad=True)
    reset = torch.zeros(3, 17, dtype=torch.bool)
    reset[0, [0, 5]] = True
    reset[1, [3, 4, 12]] = True
    w = torch.randn(3, 17, 64, dtype=torch.float64)
    params = [x, *m.parameters()]
    packed = torch.autograd.grad((m(x, reset=reset)[0] * w).sum(), params)
    per_row = torch.autograd.grad((m(x, reset=reset, return_state=True)[0] * w).sum(), params)
    for g, gr in zip(packed, per_row):
        torch.testing.assert_close(g, gr)


@pytest.mark.parametrize("policy,kernel", VARIANTS)
def test_rows_rounded_to_a_shape_quantum_change_nothing(policy, kernel, one_thread, poisoned_memory, monkeypatch):
    """The expert rows' length L is rounded up to the matmul shape quantum (16 in bfloat16 on the CPU, see
    routing.matmul_row_quantum); forced to 7 here in float64, the extra padding slots (skipped by the scan, masked
    by "ssd") change no output, state or gradient, in the packed and the per-row layouts, with documents."""
    import linlm.layers.mossnet as mossnet_module

    m = mixer(policy, kernel)
    x = torch.randn(2, 19, 64, dtype=torch.float64, requires_grad=True)
    reset = torch.zeros(2, 19, dtype=torch.bool)
    reset[0, [0, 9]] = True
    w = torch.randn(2, 19, 64, dtype=torch.float64)
    params = [x, *m.parameters()]
    runs = []
    for quantum in (1, 7):
        monkeypatch.setattr(mossnet_module, "matmul_row_quantum", lambda u, q=quantum: q)
        y, _, _ = m(x, reset=reset)
        y_rows, state, _ = m(x, reset=reset, return_state=True)
        runs.append([y, y_rows, state["ssm"], *torch.autograd.grad(((y + y_rows) * w).sum(), params)])
    for a, b in zip(*runs):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", ["s6", "ssd"])
def test_bfloat16_autocast_keeps_the_expert_rows_in_bfloat16(kernel, one_thread, poisoned_memory, monkeypatch):
    """Under bf16 autocast the conv's output, the expert rows the scan reads, the scan's output and the gate stay
    bfloat16 (the kernels' bf16 variants), and the mixer gives what converting around the float32 kernels gives
    (the kernels' bf16 dtypes switched off; the same routing, as the router sees the same input), outputs and every
    gradient within bf16 rounding (2 %, relative Frobenius norm; measured up to 0.7 %), with documents in the packed
    layout."""
    m = mixer("routed", kernel, dtype=torch.float32)
    x = torch.randn(2, 40, 64, generator=torch.Generator().manual_seed(5))
    reset = torch.zeros(2, 40, dtype=torch.bool)
    reset[:, 0] = True
    reset[0, 17] = True
    w = torch.randn(2, 40, 64, generator=torch.Generator().manual_seed(6))
    scan_u = spy_kernel_scan(monkeypatch)

    def run():
        def forward(xl):
            y, _, aux = m(xl, reset=reset)
            return y, aux

        return bf16_outputs_and_grads(m, x, w, forward)

    got = run()
    assert scan_u == ([torch.bfloat16] if kernel == "s6" else [])
    monkeypatch.setattr(kernel_library, "IO_DTYPES", (torch.float32, torch.float64))
    want = run()
    assert scan_u[1:] == ([torch.float32] if kernel == "s6" else [])
    assert_near_in_norm(m, got, want, 0.02)


def test_training_layout_keeps_every_thread_busy():
    """E rows x channel tiles fewer than the threads: the per-row layout (E x B rows) instead."""
    m = mixer()
    tiles = -(-m.d_inner // scan_kernel.TILE)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(m.n_experts * tiles)
        assert m._rows_keep_threads_busy(torch.zeros(1))
        torch.set_num_threads(m.n_experts * tiles + 1)
        assert not m._rows_keep_threads_busy(torch.zeros(1))
    finally:
        torch.set_num_threads(before)


def test_routed_packed_resets_an_expert_that_skips_a_document_start():
    """Route so that expert 0 never sees the second document's first token: its subsequence must still reset."""
    m = mixer("routed", "s6")
    x = torch.randn(1, 16, 64, dtype=torch.float64)
    _, idx = route(m, x)
    uses0 = (idx[0] == 0).any(-1)
    start = next(t for t in range(2, 15) if not uses0[t] and uses0[t + 1:].any() and uses0[:t].any())
    reset = torch.zeros(1, 16, dtype=torch.bool)
    reset[0, [0, start]] = True
    with torch.no_grad():
        got = m(x, reset=reset)[0]
        want = torch.cat([m(x[:, :start])[0], m(x[:, start:])[0]], 1)
    torch.testing.assert_close(got, want)


# ------------------------------------------------------------------------------------------------ reduction
@pytest.mark.parametrize("policy", ["routed", "dense"])
def test_one_expert_reduces_to_mamba_block_plus_mlp(policy):
    kw = dict(ssm_experts=1, ssm_top_k=1, mlp_experts=1, mlp_top_k=1, shared_experts=0, ssm_policy=policy)
    moss = create_model("mossnet", preset="tiny", **kw).double()
    mamba = create_model("mamba", preset="tiny").double()
    randomize_(moss)
    mb, mm = moss.layers[0], mamba.layers[0]
    with torch.no_grad():
        mm.norm1.weight.copy_(mb.norm1.weight)
        for name, p in mm.mixer.named_parameters():
            src = mb.mixer.get_parameter(name)
            p.copy_(src[0] if src.dim() == p.dim() + 1 else src)
    x = torch.randn(2, 23, 64, dtype=torch.float64)
    with torch.no_grad():
        got = mb(x)[0]
        h = x + mm.mixer(mm.norm1(x))[0]
        w_in, w_out = mb.mlp.w_in[0], mb.mlp.w_out[0]
        gate, up = F.linear(mb.norm2(h), w_in).chunk(2, -1)
        want = h + F.linear(F.silu(gate) * up, w_out)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert moss.layers[0].mixer.x_proj.weight.shape == mamba.layers[0].mixer.x_proj.weight.shape


# ------------------------------------------------------------------------------------------------ sizes, configs
def test_presets_match_llama_active_size():
    for preset in ("paper-70m", "paper-160m", "paper-410m", "paper-1b", "paper-3b", "paper-7b"):
        want = count_preset("llama", preset)["non_embedding_params"]
        c = count_preset("mossnet", preset)
        assert abs(c["active_non_embedding_params"] - want) / want < 0.02, preset
        assert c["non_embedding_params"] > 1.5 * c["active_non_embedding_params"]  # 8 MLP experts, 2 active
        assert c["config"]["n_layers"] == preset_config("llama", preset).n_layers


def test_active_params_and_flops_follow_policy():
    routed = count_preset("mossnet", "tiny", ssm_policy="routed", seq_len=256, batch=1)
    dense = count_preset("mossnet", "tiny", ssm_policy="dense", seq_len=256, batch=1)
    assert routed["non_embedding_params"] == dense["non_embedding_params"]
    m = MossNetMixer(preset_config("mossnet", "tiny"), 0)
    per_expert = m._per_expert_params()
    n_layers, E, k = 2, 4, 2
    assert dense["active_non_embedding_params"] - routed["active_non_embedding_params"] == n_layers * (E - k) * per_expert
    assert dense["counted_flops_per_token"] > routed["counted_flops_per_token"]
    assert routed["flops_per_step_source"] == "counted from layer shapes"
    assert routed["flops_per_step"] == 3 * routed["forward_flops_per_token"] * 256


def test_count_cli_reports_active_parameters(capsys):
    import json

    from linlm.cli import main

    assert main(["count", "--arch", "mossnet", "--preset", "paper-410m", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["active_non_embedding_params"] < data["non_embedding_params"]


@pytest.mark.parametrize("policy,kernel", [("dense", "s6"), ("routed", "ssd"), ("dense", "ssd")])
def test_gradients_reach_every_parameter_in_other_variants(policy, kernel):
    model = create_model("mossnet", preset="tiny", ssm_policy=policy, ssm_kernel=kernel)
    ids = torch.randint(0, 512, (2, 37))
    out = model(ids, return_aux=True)
    (F.cross_entropy(out.logits.flatten(0, 1), ids.flatten()) + out.aux_loss).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_paper_preset_builds_with_small_vocab():
    model = create_model("mossnet", preset="paper-70m", vocab_size=8192)
    assert model.config.ssm_experts == 4 and model.config.mlp_experts == 8


@pytest.mark.parametrize(
    "overrides,pattern",
    [
        (dict(ssm_top_k=5), r"ssm_top_k: 5 is out of range; valid values are 1\.\.4"),
        (dict(ssm_top_k=0), r"ssm_top_k: 0 is out of range; valid values are 1\.\.4"),
        (dict(mlp_top_k=9, mlp_experts=8), r"mlp_top_k: 9 is out of range; valid values are 1\.\.8"),
        (dict(mlp_top_k=0), r"mlp_top_k: 0 is out of range"),
        (dict(ssm_experts=0), r"ssm_experts: must be a positive number of experts, got 0"),
        (dict(mlp_experts=-1), r"mlp_experts: must be a positive number of experts, got -1"),
        (dict(ssm_policy="sparse"), r"ssm_policy: unknown policy 'sparse'; valid choices are 'dense', 'routed'"),
        (dict(ssm_kernel="s4"), r"ssm_kernel: unknown kernel 's4'; valid choices are 's6', 'ssd'"),
        (dict(balance_loss_coef=-1.0), r"balance_loss_coef: must be >= 0"),
        (dict(glu_dim=2, mlp_top_k=2, shared_experts=1), r"mlp_expert_dim: .* is 0"),
    ],
)
def test_bad_configs_name_key_and_choices(overrides, pattern):
    with pytest.raises(ConfigError, match=pattern):
        create_model("mossnet", preset="tiny", **overrides)


def test_save_load_roundtrip_of_a_non_default_variant(tmp_path):
    import linlm

    model = create_model("mossnet", preset="tiny", ssm_policy="dense", ssm_kernel="ssd", shared_experts=1).eval()
    randomize_(model)
    model.save(tmp_path / "m")
    loaded = linlm.load(tmp_path / "m").eval()
    ids = torch.randint(0, 512, (1, 17))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))


def test_mamba_block_is_the_shared_skeleton():
    """The MossNet mixer keeps Mamba's shared parameter names, so weights can be copied across (reduction)."""
    cfg = preset_config("mossnet", "tiny")
    shared = {n for n, _ in MossNetMixer(cfg, 0).named_parameters()}
    assert {n for n, _ in MambaMixer(preset_config("mamba", "tiny"), 0).named_parameters()} <= shared
