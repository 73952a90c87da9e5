"""fla's DeltaNetForCausalLM and GatedDeltaNetForCausalLM layouts -> linlm deltanet / gated_deltanet: a converted
checkpoint computes what fla computes (against fla_delta_reference.py, written from fla's equations, to 1e-5), and a
setting linlm does not compute is refused naming the field."""

import pytest
import torch

import fla_delta_reference as fla
from fla_reference import write_fla
import linlm
from linlm.errors import CheckpointError

DELTANET = dict(model_type="delta_net", architectures=["DeltaNetForCausalLM"], hidden_size=32, num_hidden_layers=2,
                num_heads=4, vocab_size=61, hidden_act="swish", attn_mode="chunk")
GATED = dict(model_type="gated_deltanet", architectures=["GatedDeltaNetForCausalLM"], hidden_size=32,
             num_hidden_layers=2, num_heads=2, head_dim=12, vocab_size=61, hidden_act="swish", attn_mode="chunk")
VARIANTS = {
    "deltanet": DELTANET,
    "deltanet_no_conv_neg_eigval_tied": dict(DELTANET, use_short_conv=False, allow_neg_eigval=True,
                                             tie_word_embeddings=True, intermediate_size=40),
    "gated": GATED,
    "gated_conv3_expand1": dict(GATED, conv_size=3, expand_v=1.0, hidden_ratio=2, allow_neg_eigval=True),
    "gated_grouped_values": dict(GATED, num_v_heads=6, expand_v=1.0),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_converted_fla_delta_checkpoint_computes_what_fla_computes(tmp_path, name):
    config = VARIANTS[name]
    sd = fla.random_state(config, seed=1)
    linlm.convert(write_fla(tmp_path / "fla", config, sd), tmp_path / "ours")
    model = linlm.load(tmp_path / "ours").eval()
    assert model.config.arch == ("gated_deltanet" if config["model_type"] == "gated_deltanet" else "deltanet")
    ids = torch.randint(0, config["vocab_size"], (2, 70), generator=torch.Generator().manual_seed(2))
    want = fla.forward(config, sd, ids)
    assert want.abs().max() > 0.5  # logits of order 1: the tolerances below are meaningful
    with torch.no_grad():
        single = model(ids).double()
        double = model.double()(ids)
    # The mapping, computed in float64 like the reference; and the float32 model within float32's rounding.
    torch.testing.assert_close(double, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(single, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("config, field", [
    (dict(DELTANET, use_beta=False), "use_beta"), (dict(DELTANET, use_gate=True), "use_gate"),
    (dict(DELTANET, qk_norm="sum"), "qk_norm"), (dict(DELTANET, qk_activation="relu"), "qk_activation"),
    (dict(DELTANET, expand_k=0.5), "expand_k"), (dict(DELTANET, conv_bias=True), "conv_bias"),
    (dict(DELTANET, attn={"layers": [1], "num_heads": 4}), "attn"), (dict(GATED, use_gate=False), "use_gate"),
    (dict(GATED, num_v_heads=3), "num_v_heads"), (dict(GATED, num_v_heads=1), "num_v_heads"),
    (dict(GATED, hidden_act="gelu"), "hidden_act"),
])
def test_an_unsupported_fla_setting_is_refused_naming_the_field(tmp_path, config, field):
    sd = fla.random_state({k: v for k, v in config.items() if k not in ("num_v_heads", "expand_k")}, seed=0)
    with pytest.raises(CheckpointError, match=rf"^{field}: "):
        linlm.convert(write_fla(tmp_path / "fla", config, sd), tmp_path / "ours")
    assert not (tmp_path / "ours").exists()
