"""DeltaNet's and Gated DeltaNet's token mixers: each against a float64 reference written from the papers'
equations (module docstrings of layers/deltanet.py and layers/gated_deltanet.py), the FLOP hook against the op's
counted matmuls, the parameter count by hand, the presets against LLaMA's, and their options.

The model-level invariants (prefill + decoding equals the full pass, a packed batch equals its documents one by
one), saving and loading, the transformers classes and ONNX export run for every registered architecture in
tests/models, tests/hf and tests/infer.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from linlm import create_model
from linlm.errors import ConfigError
from linlm.models.counting import count_preset
from linlm.models.measure import forward_flops_per_token
from linlm.models.presets import PRESETS
from linlm.ops.delta_rule import delta_rule_reference

ARCHS = ("deltanet", "gated_deltanet")


def reference_mixer(mixer, x, gated: bool):
    """The layer from its equations, in float64, with the op's reference (a loop over time)."""
    B, T, d = x.shape
    H, Hk, K, V = mixer.n_heads, mixer.k_heads, mixer.k_dim, mixer.v_dim
    z = x @ mixer.proj.weight.T
    width = 2 * Hk * K + H * V
    qkv, rest = z[..., :width], z[..., width:]
    w = mixer.conv.weight  # [channels, kernel], nn.Conv1d's tap order
    conv = F.conv1d(qkv.transpose(1, 2), w.unsqueeze(1), padding=w.shape[1] - 1, groups=w.shape[0])[..., :T]
    qkv = F.silu(conv.transpose(1, 2))
    q, k, v = qkv.split([Hk * K, Hk * K, H * V], dim=-1)
    unit = lambda t: t / (t.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()  # noqa: E731
    # value head h reads q and k head h // (H / Hk), copied out head by head
    per_value_head = lambda t: torch.stack([t[:, :, h * Hk // H] for h in range(H)], dim=2)  # noqa: E731
    q, k = per_value_head(q.reshape(B, T, Hk, K)), per_value_head(k.reshape(B, T, Hk, K))
    q, k, v = unit(q) / math.sqrt(K), unit(k), v.reshape(B, T, H, V)
    if gated:
        g, a, b = rest.split([H * V, H, H], dim=-1)
        log_a = -mixer.A_log.exp() * F.softplus(a + mixer.dt_bias)
    else:
        b, log_a = rest, None
    o, _ = delta_rule_reference(q, k, v, torch.sigmoid(b), log_a)
    o = o / (o.pow(2).mean(-1, keepdim=True) + mixer.norm.eps).sqrt() * mixer.norm.weight
    if gated:
        o = o * F.silu(g.reshape(B, T, H, V))
    return o.reshape(B, T, H * V) @ mixer.out.weight.T


@pytest.mark.parametrize("arch, options", [("deltanet", {}), ("gated_deltanet", {}),
                                           ("gated_deltanet", dict(v_heads=6))])
def test_mixer_matches_the_equations(arch, options):
    torch.manual_seed(0)
    model = create_model(arch, preset="tiny", options=options).double()
    mixer = model.layers[1].mixer
    with torch.no_grad():  # weights away from their init: the norm weight and A_log are not all alike
        mixer.norm.weight.uniform_(0.5, 1.5)
        mixer.conv.weight.normal_(0.0, 0.5)
    x = torch.randn(2, 45, model.config.d_model, dtype=torch.float64)
    y, _ = mixer(x)
    torch.testing.assert_close(y, reference_mixer(mixer, x, arch == "gated_deltanet"), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("arch, options", [("deltanet", {}), ("gated_deltanet", {}),
                                           ("gated_deltanet", dict(v_heads=4))])
def test_flop_hook_counts_what_the_forward_multiplies(arch, options):
    """FLOPs of the mixer's matmuls, counted by torch while it runs, equal the model's count (the walk over its
    Linear layers plus its mixing hook) per token: T a multiple of the chunk, so nothing is padding."""
    model = create_model(arch, preset="tiny", options=options)
    mixer = model.layers[0].mixer
    B, T = 2, 4 * model.config.chunk_size
    x = torch.randn(B, T, model.config.d_model)
    with FlopCounterMode(display=False) as counter:
        mixer(x)
    per_token = forward_flops_per_token(mixer, T) - mixer.conv.flops_per_token(T)  # the conv is no matmul
    assert counter.get_total_flops() == per_token * B * T
    assert mixer.mixing_flops_per_token(T) > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_parameters_by_hand(arch):
    cfg = create_model(arch, preset="tiny").config
    d, H, glu = cfg.d_model, cfg.n_heads, cfg.glu_hidden
    if arch == "deltanet":
        K = V = d // H
        mixer = d * (H * (2 * K + V) + H) + H * (2 * K + V) * 4 + V + H * V * d
    else:
        K = 3 * d // (4 * H)
        V = 2 * K
        mixer = d * (H * (2 * K + V) + H * V + 2 * H) + H * (2 * K + V) * 4 + V + H * V * d + 2 * H
    block = mixer + 3 * d * glu + 2 * d
    counted = count_preset(arch, "tiny")
    assert counted["non_embedding_params"] == cfg.n_layers * block + d  # and the final norm


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.startswith("paper-")])
@pytest.mark.parametrize("arch", ARCHS)
def test_presets_match_llama_within_2_percent(arch, preset):
    """Same d, layers and heads as LLaMA's row; the GLU width (a multiple of 8) brings the non-embedding
    parameters to LLaMA's."""
    mine, llama = count_preset(arch, preset), count_preset("llama", preset)
    for key in ("d_model", "n_layers", "n_heads"):
        assert mine["config"][key] == llama["config"][key]
    assert mine["config"]["glu_dim"] % 8 == 0
    ratio = mine["non_embedding_params"] / llama["non_embedding_params"]
    assert abs(ratio - 1) < 0.02, ratio


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("options", [dict(short_conv=0), dict(short_conv=2, neg_eigval=True), dict(v_heads=4),
                                     dict(mlp_experts=4, mlp_top_k=2, shared_expert_dim=24, shared_expert_gate=True)])
def test_option_variants_decode_as_the_full_pass(arch, options):
    if arch == "deltanet" and ("v_heads" in options or "mlp_experts" in options):
        pytest.skip("v_heads and the sparse MLP are Gated DeltaNet's")
    torch.manual_seed(1)
    model = create_model(arch, preset="tiny", options=options).eval()
    ids = torch.randint(0, 512, (2, 30))
    with torch.no_grad():
        full = model(ids)
        out = model(ids[:, :7], return_state=True)
        pieces, state = [out.logits], out.state
        for t in range(7, 30):
            step = model(ids[:, t: t + 1], state=state, return_state=True)
            pieces.append(step.logits)
            state = step.state
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-4, atol=1e-5)
    if options.get("neg_eigval"):
        beta, _ = model.layers[0].mixer.gates(torch.full((1, 1, 200), 30.0))
        assert beta.max() > 1.99  # 2 sigmoid(.), up to 2


def test_gated_deltanet_value_heads_by_hand():
    """v_heads = 6 over n_heads = 2 key heads: q and k stay 2 heads wide, v, the gate, a, b and the state are 6."""
    model = create_model("gated_deltanet", preset="tiny", options=dict(v_heads=6))
    cfg, mixer = model.config, model.layers[0].mixer
    d, Hk, H = cfg.d_model, cfg.n_heads, 6
    K = 3 * d // (4 * Hk)
    V = 2 * K
    assert (mixer.k_heads, mixer.n_heads, mixer.k_dim, mixer.v_dim) == (Hk, H, K, V)
    conv = 2 * Hk * K + H * V
    params = d * (conv + H * V + 2 * H) + conv * 4 + V + H * V * d + 2 * H
    assert sum(p.numel() for p in mixer.parameters()) == params
    assert tuple(mixer.state_spec(3, 100, torch.float32)["delta"].shape) == (3, H, K, V)


def test_gated_deltanet_widths():
    cfg = create_model("gated_deltanet", preset="tiny", options=dict(head_k_dim=8, expand_v=1.5)).config
    mixer = create_model("gated_deltanet", preset="tiny", options=dict(head_k_dim=8, expand_v=1.5)).layers[0].mixer
    assert (mixer.k_dim, mixer.v_dim) == (8, 12) and cfg.options.head_k_dim == 8


@pytest.mark.parametrize("arch,options,needle", [
    ("deltanet", dict(short_conv=-1), r"^options.short_conv: must be >= 0"),
    ("gated_deltanet", dict(head_k_dim=-2), r"^options.head_k_dim: must be >= 0"),
    ("gated_deltanet", dict(expand_v=0), r"^options.expand_v: must be > 0"),
    ("gated_deltanet", dict(head_k_dim=5, expand_v=1.5), r"^options.expand_v: head_k_dim x expand_v = 5 x 1.5 = 7.5"),
    ("gated_deltanet", dict(v_heads=-1), r"^options.v_heads: must be >= 0"),
    ("gated_deltanet", dict(v_heads=3), r"^options.v_heads: 3 value heads is not a multiple of n_heads=2"),
    ("gated_deltanet", dict(mlp_experts=-1), r"^options.mlp_experts: must be 0 \(a dense MLP\) to 4096"),
    ("gated_deltanet", dict(mlp_experts=5000), r"^options.mlp_experts: must be 0 \(a dense MLP\) to 4096"),
    ("gated_deltanet", dict(mlp_experts=4, mlp_top_k=5),
     r"^options.mlp_top_k: 5 is out of range; valid values are 1..4"),
    ("gated_deltanet", dict(mlp_experts=4, mlp_top_k=0), r"^options.mlp_top_k: 0 is out of range"),
    ("gated_deltanet", dict(mlp_experts=4, shared_expert_dim=-8), r"^options.shared_expert_dim: must be >= 0"),
])
def test_bad_options_are_refused(arch, options, needle):
    with pytest.raises(ConfigError, match=needle):
        create_model(arch, preset="tiny", options=options)
