"""Three corrections to follow the authors' code: TNL's slopes, SiLU on TNL's v, cosFormer2's gate before the norm.

Each is an option whose default is the authors' choice; a config saved before it existed reads back with the old
value and computes exactly what it computed.
"""

import json

import pytest
import torch
import torch.nn.functional as F

import linlm
from linlm.layers.cosformer2 import lrpe, lrpe_factors
from linlm.layers.tnl import tnl_log_decay, tnl_slopes
from linlm.models.archs.cosformer2 import CosFormer2Options
from linlm.models.archs.tnl import TNLOptions
from linlm.models.model_config import ModelConfig
from linlm.models.lm import CausalLM
from linlm.ops.gla import gla_reference

# Slopes worked out by hand from the authors' ALiBi construction (as their code builds ALiBi slopes):
# H = 6: n = 4 (largest power of two <= 6). The set for 4 is 2^(-8(h+1)/4) = 2^-2, 2^-4, 2^-6, 2^-8. The set for
#   2n = 8 is 2^-1, 2^-2, ..., 2^-8; every other entry (indices 0, 2, 4, 6) is 2^-1, 2^-3, 2^-5, 2^-7, of which the
#   first H - n = 2 are taken: 2^-1, 2^-3.
# H = 12: n = 8. The set for 8 is 2^-1 ... 2^-8. The set for 16 is 2^(-(h+1)/2) = 2^-0.5, 2^-1, 2^-1.5, ...; every
#   other entry is 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5, ...; the first 4: 2^-0.5 = 0.70710678..., 2^-1.5 = 0.35355339...,
#   2^-2.5 = 0.17677669..., 2^-3.5 = 0.08838834...
# H = 20: n = 16. The set for 16 is 2^-0.5, 2^-1, ..., 2^-8 (steps of 0.5 in the exponent). The set for 32 is
#   2^(-(h+1)/4) = 2^-0.25, 2^-0.5, 2^-0.75, ...; every other entry is 2^-0.25, 2^-0.75, 2^-1.25, 2^-1.75, ...; the
#   first 4: 0.84089641..., 0.59460355..., 0.42044820..., 0.29730177...
HAND_SLOPES = {
    6: [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125],
    12: [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,
         0.7071067811865476, 0.3535533905932738, 0.1767766952966369, 0.08838834764831845],
    20: [0.7071067811865476, 0.5, 0.3535533905932738, 0.25, 0.1767766952966369, 0.125, 0.08838834764831845,
         0.0625, 0.04419417382415922, 0.03125, 0.02209708691207961, 0.015625, 0.011048543456039806, 0.0078125,
         0.005524271728019903, 0.00390625,
         0.8408964152537145, 0.5946035575013605, 0.42044820762685725, 0.29730177875068026],
}


@pytest.mark.parametrize("H", sorted(HAND_SLOPES))
def test_tnl_slopes_match_hand_values(H):
    assert tnl_slopes(H) == pytest.approx(HAND_SLOPES[H], rel=1e-14)
    # The former rule differs exactly where the head count is not a power of two.
    assert tnl_slopes(H, "pow2") != pytest.approx(HAND_SLOPES[H], rel=1e-3)


@pytest.mark.parametrize("H", [1, 2, 4, 8, 32])
def test_tnl_slopes_power_of_two_unchanged(H):
    assert tnl_slopes(H) == [2.0 ** (-8.0 * (h + 1) / H) for h in range(H)] == tnl_slopes(H, "pow2")


def test_tnl_log_decay_uses_slopes_and_depth():
    got = tnl_log_decay(6, 3, 12).double()
    want = -torch.tensor(HAND_SLOPES[6], dtype=torch.float64) * (1 - 3 / 11 + 1e-5)
    torch.testing.assert_close(got, want.float().double(), rtol=0, atol=0)


def _cfg(arch, **kw):
    return ModelConfig.from_dict(dict(arch=arch, vocab_size=64, d_model=48, n_layers=3, n_heads=6, glu_dim=64,
                                      chunk_size=8, **kw))


# The options' values before they existed (ArchSpec.saved_before), in the flat spelling of that time.
SAVED_BEFORE = {"tnl_slopes": "pow2", "tnl_v_silu": False, "cosformer2_gate_before_norm": False}


def _srms(x, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _gate(mixer, x):
    return torch.sigmoid(mixer.gate.up(mixer.gate.down(x)))


@pytest.mark.parametrize("rule,v_silu", [("alibi", True), ("pow2", False), ("alibi", False), ("pow2", True)])
def test_tnl_mixer_against_its_definition(rule, v_silu):
    cfg = _cfg("tnl", options={"slopes": rule, "v_silu": v_silu})
    assert cfg == _cfg("tnl", tnl_slopes=rule, tnl_v_silu=v_silu)  # the earlier flat spelling means the same
    layer = 1
    mixer = CausalLM(cfg).layers[layer].mixer.double()
    B, T, H, K = 2, 21, 6, 8
    x = torch.randn(B, T, 48, dtype=torch.float64)
    q, k, v = mixer.qkv(x).view(B, T, 3, H, K).unbind(2)
    slopes = HAND_SLOPES[6] if rule == "alibi" else [2.0 ** (-8.0 * (h + 1) / 6) for h in range(6)]
    # The module keeps its log-decay in float32.
    log_a = (-torch.tensor(slopes, dtype=torch.float64) * (1 - layer / 2 + 1e-5)).float().double()
    o, _ = gla_reference(F.silu(q), F.silu(k), F.silu(v) if v_silu else v, log_a)
    want = mixer.out(_srms(o.reshape(B, T, 48), cfg.norm_eps) * _gate(mixer, x))
    got, _ = mixer(x)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("before", [True, False])
def test_cosformer2_gate_order(before):
    cfg = _cfg("cosformer2", options={"gate_before_norm": before})
    assert cfg == _cfg("cosformer2", cosformer2_gate_before_norm=before)
    mixer = CausalLM(cfg).layers[0].mixer.double()
    B, T, H, K = 2, 13, 6, 8
    x = torch.randn(B, T, 48, dtype=torch.float64)
    qkv = mixer.qkv(x).view(B, T, 3, H, K)
    factors = lrpe_factors(mixer.theta, 0, T, qkv.dtype)
    q, k = lrpe(F.silu(qkv[:, :, 0]), factors), lrpe(F.silu(qkv[:, :, 1]), factors)
    o, _ = gla_reference(q, k, qkv[:, :, 2])  # v has no activation, and there is no decay
    o, g = o.reshape(B, T, 48), _gate(mixer, x)
    y = _srms(o * g, cfg.norm_eps) if before else _srms(o, cfg.norm_eps) * g
    got, _ = mixer(x)
    torch.testing.assert_close(got, mixer.out(y), rtol=1e-9, atol=1e-9)


def test_new_configs_get_the_authors_choices():
    assert ModelConfig.from_dict({"arch": "tnl", "n_heads": 2, "d_model": 64}).options == TNLOptions("alibi", True)
    assert ModelConfig.from_dict({"arch": "cosformer2"}).options == CosFormer2Options(gate_before_norm=True, tpe=True)


def _flat_before_the_options(cfg: ModelConfig) -> dict:
    """cfg's config.json "config" as linlm wrote it before these options existed: flat, with tpe, no options."""
    data = cfg.to_dict()
    data.pop("options")
    return {**data, "tpe": True}


@pytest.mark.parametrize("arch,old", [("tnl", TNLOptions("pow2", False)),
                                      ("cosformer2", CosFormer2Options(gate_before_norm=False, tpe=True))])
def test_saved_config_without_the_keys_reads_the_old_choices(arch, old):
    data = _flat_before_the_options(_cfg(arch))
    assert ModelConfig.from_saved(data).options == old


def test_saved_config_keeps_the_options_it_holds_in_either_spelling():
    data = _flat_before_the_options(_cfg("tnl"))
    assert ModelConfig.from_saved({**data, "tnl_v_silu": True}).options == TNLOptions("pow2", True)
    del data["tpe"]
    assert ModelConfig.from_saved({**data, "options": {"slopes": "alibi"}}).options == TNLOptions("alibi", False)
    # A config saved with every option computes with what it holds: nothing is filled in.
    assert ModelConfig.from_saved(_cfg("tnl").to_dict()).options == TNLOptions("alibi", True)


@pytest.mark.parametrize("arch", ["tnl", "cosformer2"])
def test_model_saved_before_the_options_computes_what_it_computed(tmp_path, arch):
    old = CausalLM(_cfg(arch, **SAVED_BEFORE)).eval()  # what linlm built before the options existed
    old.save(tmp_path / "m")
    # Rewrite config.json as the earlier format wrote it: version 1, no config_sha256, flat, none of the new keys.
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    meta["format_version"] = 1
    del meta["config_sha256"]
    meta["config"] = _flat_before_the_options(old.config)
    (tmp_path / "m" / "config.json").write_text(json.dumps(meta))

    ids = torch.randint(0, 64, (2, 17))
    loaded = linlm.load(tmp_path / "m").eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids), old(ids))
        # The same weights under the new defaults compute something else: the fill-in is what keeps them equal.
        new = CausalLM(ModelConfig.from_dict(meta["config"])).eval()
        new.load_state_dict(old.state_dict())
        assert (new(ids) - old(ids)).abs().max() > 1e-4


def test_cosformer2_positions_in_a_float64_model_are_float64():
    # At position 1e5 a float32 angle is about 4e-3 off: a float64 model computes its angles in float64.
    theta = 10000.0 ** (-2.0 * torch.arange(8, dtype=torch.float64) / 8).repeat(2, 1)
    t = torch.arange(100_000, 100_004, dtype=torch.float64)
    angle = t[:, None, None] * theta
    want = torch.stack([angle.cos(), angle.sin()], dim=-2)
    torch.testing.assert_close(lrpe_factors(theta, 100_000, 4, torch.float64), want, rtol=0, atol=1e-12)


def test_cosformer2_tpe_decay_in_a_float64_model_is_float64():
    model = CausalLM(_cfg("cosformer2")).double()
    tpe = model.embed_mixer
    B, T, H, K = 2, 13, tpe.n_heads, tpe.head_dim
    x = torch.randn(B, T, H * K, dtype=torch.float64)
    q, k = (p.expand(B, T, H, K) for p in (tpe.q, tpe.k))
    o, _ = gla_reference(q, k, x.view(B, T, H, K), F.logsigmoid(tpe.decay_logit))
    want = x + F.rms_norm(o, (K,), eps=tpe.eps).reshape(B, T, H * K) * tpe.weight
    got, _ = tpe(x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
