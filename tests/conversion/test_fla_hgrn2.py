"""fla's HGRN2ForCausalLM layout <-> linlm HGRN2: a converted checkpoint computes what fla computes (against the
reference in fla_reference.py, written from fla's equations), and converts back to the same tensors."""

import json

import pytest
import torch
from safetensors.torch import load_file

import linlm
from linlm.errors import CheckpointError, ConfigError
import fla_reference as fla
from fla_reference import write_fla

BASE = dict(model_type="hgrn2", architectures=["HGRN2ForCausalLM"], hidden_size=32, num_hidden_layers=3,
            num_heads=4, expand_ratio=8, vocab_size=61, hidden_act="swish", attn_mode="chunk")
VARIANTS = {
    "fla_defaults": dict(),
    "no_lower_bound_no_affine_tied": dict(use_lower_bound=False, elementwise_affine=False, tie_word_embeddings=True,
                                          intermediate_size=40),
    "short_conv": dict(use_short_conv=True, conv_size=3, hidden_ratio=2),
    # A large eps, so that the output norm does not hide the scale of q.
    "heads_from_num_heads": dict(expand_ratio=None, num_heads=2, norm_eps=0.05),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_converted_fla_checkpoint_computes_what_fla_computes(tmp_path, name):
    config = {**BASE, **VARIANTS[name]}
    sd = fla.random_state(config, seed=1)
    src = write_fla(tmp_path / "fla", config, sd)
    linlm.convert(src, tmp_path / "ours")
    model = linlm.load(tmp_path / "ours").eval()
    ids = torch.randint(0, config["vocab_size"], (2, 80), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        single = model(ids).double()
        double = model.double()(ids)
    want = fla.forward(config, sd, ids)
    # The mapping, computed in float64 like the reference (1.4e-14 off at most, measured: the gates follow the model's
    # precision, float32 at least); and the float32 model within float32's rounding of logits up to about 7 (4.5e-6
    # to 6.7e-6 measured, by CPU), as test_fla_delta.py.
    torch.testing.assert_close(double, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(single, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", VARIANTS)
def test_fla_checkpoint_converts_back_to_the_same_tensors(tmp_path, name):
    config = {**BASE, **VARIANTS[name]}
    sd = fla.random_state(config, seed=3)
    linlm.convert(write_fla(tmp_path / "fla", config, sd), tmp_path / "ours")
    linlm.convert(tmp_path / "ours", tmp_path / "back", to="fla-hgrn2")
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert sorted(back) == sorted(sd)
    for key, value in sd.items():
        assert torch.equal(back[key], value), key
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    ids = torch.randint(0, config["vocab_size"], (1, 20))
    torch.testing.assert_close(fla.forward(written, back, ids), fla.forward(config, sd, ids), rtol=0, atol=1e-12)


def test_the_papers_hgrn2_defaults_are_unchanged_and_do_not_convert_to_fla(tmp_path):
    model = linlm.create_model("hgrn2", preset="tiny", vocab_size=64)
    opts = model.config.options
    assert (opts.lower_bound, opts.q_scale, opts.out_norm_weight, opts.short_conv, opts.mlp_act) == \
        (True, False, False, 0, "none")
    model.save(tmp_path / "paper")
    with pytest.raises(ConfigError, match=r"needs norm_type='rms', options.q_scale=true, options.mlp_act='silu'"):
        linlm.convert(tmp_path / "paper", tmp_path / "fla", to="fla-hgrn2")
    assert not (tmp_path / "fla").exists()


@pytest.mark.parametrize("change,match", [
    (dict(attn={"layers": [1], "num_heads": 2}), r"^attn: hybrid checkpoints"),
    (dict(hidden_act="gelu"), r"^hidden_act: 'gelu' is not supported"),
    (dict(expand_ratio=12), r"^expand_ratio: 12 does not divide hidden_size=32"),
    (dict(use_short_conv=True, share_conv_kernel=True), r"^share_conv_kernel: "),
])
def test_fla_settings_linlm_cannot_build_are_refused(tmp_path, change, match):
    config = {**BASE, **change}
    sd = fla.random_state({**BASE, **{k: v for k, v in change.items() if k == "use_short_conv"}})
    src = write_fla(tmp_path / "fla", config, sd)
    with pytest.raises(CheckpointError, match=match):
        linlm.convert(src, tmp_path / "ours")
    assert not (tmp_path / "ours").exists()


def test_a_state_dict_with_tensors_no_part_of_the_model_reads_is_refused(tmp_path):
    sd = fla.random_state(BASE)
    sd["model.layers.0.attn.q_proj.bias"] = torch.zeros(32)
    with pytest.raises(CheckpointError, match=r"1 tensors fit no part of the model.*q_proj\.bias"):
        linlm.convert(write_fla(tmp_path / "fla", BASE, sd), tmp_path / "ours")


def test_decoding_a_converted_short_conv_model_matches_its_full_pass(tmp_path):
    config = {**BASE, **VARIANTS["short_conv"]}
    linlm.convert(write_fla(tmp_path / "fla", config, fla.random_state(config)), tmp_path / "ours")
    model = linlm.load(tmp_path / "ours").eval()
    ids = torch.randint(0, 61, (2, 12))
    with torch.no_grad():
        full = model(ids)
        out = model(ids[:, :5], return_state=True)
        pieces, state = [out.logits], out.state
        for t in range(5, 12):
            step = model(ids[:, t:t + 1], state=state, return_state=True)
            pieces.append(step.logits)
            state = step.state
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=0, atol=1e-5)


def test_the_hgrn2_options_are_checked():
    with pytest.raises(ConfigError, match=r"^options.mlp_act: unknown activation 'gelu'; valid choices are 'none', "
                                          r"'silu'"):
        linlm.ModelConfig.from_dict({"arch": "hgrn2", "options": {"mlp_act": "gelu"}})
    with pytest.raises(ConfigError, match=r"^options.short_conv: must be >= 0"):
        linlm.ModelConfig.from_dict({"arch": "hgrn2", "options": {"short_conv": -1}})
    model = linlm.create_model("hgrn2", preset="tiny", vocab_size=64, options={"lower_bound": False})
    assert model.shared is None and not any(n.startswith("shared.") for n in model.state_dict())
