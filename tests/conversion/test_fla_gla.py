"""fla's GLAForCausalLM layout <-> linlm GLA: a converted checkpoint computes what fla computes (against the
reference in fla_gla_reference.py, written from fla's equations), converts back to the same tensors, and settings
linlm cannot compute are refused naming the field."""

import json

import pytest
import torch
from safetensors.torch import load_file

import linlm
from linlm.cli import main
from linlm.errors import CheckpointError
from output_asserts import one_line_error
import fla_gla_reference as fla

BASE = dict(model_type="gla", architectures=["GLAForCausalLM"], hidden_size=32, num_hidden_layers=2, num_heads=2,
            vocab_size=61, hidden_act="swish", attn_mode="chunk")
VARIANTS = {
    "fla_defaults": dict(),
    "unfused_norm_tied_wide_keys": dict(fuse_norm=False, tie_word_embeddings=True, expand_k=1, expand_v=2,
                                        intermediate_size=48, gate_low_rank_dim=8, gate_logit_normalizer=8),
}


from fla_reference import write_fla  # noqa: E402


@pytest.mark.parametrize("name", VARIANTS)
def test_converted_fla_gla_computes_what_fla_computes_and_converts_back(tmp_path, name):
    config = {**BASE, **VARIANTS[name]}
    sd = fla.random_state(config, seed=1)
    linlm.convert(write_fla(tmp_path / "fla", config, sd), tmp_path / "ours")
    model = linlm.load(tmp_path / "ours").eval()
    ids = torch.randint(0, config["vocab_size"], (2, 70), generator=torch.Generator().manual_seed(2))
    want = fla.forward(config, sd, ids)
    with torch.no_grad():
        single = model(ids).double()
        double = model.double()(ids)
    # The mapping, computed in float64 like the reference (exact to 1e-14 here); and the float32 model within
    # float32's rounding of logits up to about 7 (1.4e-5 on an AMX Xeon, 5e-6 on Zen 4), as test_fla_delta.py.
    torch.testing.assert_close(double, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(single, want, rtol=0, atol=1e-4)
    linlm.convert(tmp_path / "ours", tmp_path / "back", to="fla-gla")
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    torch.testing.assert_close(fla.forward(written, back, ids[:, :20]), fla.forward(config, sd, ids[:, :20]),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("field, value", [("use_short_conv", True), ("num_kv_heads", 1), ("clamp_min", -1.0),
                                          ("use_output_gate", False), ("gate_fn", "sigmoid"), ("use_gv", True)])
def test_settings_linlm_cannot_compute_are_refused_naming_the_field(tmp_path, capsys, field, value):
    config = {**BASE, field: value}
    src = write_fla(tmp_path / "fla", config, fla.random_state(BASE))
    with pytest.raises(CheckpointError, match=f"^{field}: "):
        linlm.convert(src, tmp_path / "ours")
    assert main(["convert", str(src), "--out", str(tmp_path / "ours")]) == 2
    one_line_error(capsys.readouterr().err, field)
    assert not (tmp_path / "ours").exists()
