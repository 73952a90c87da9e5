"""Each architecture's transformers config: the model's settings as attributes (one value each, under transformers'
names where they exist), defaults from linlm's preset, models built from AutoConfig.for_model, config.json checked
against the weights it comes with, and config.json files of the earlier format (linlm's ModelConfig nested in a
``linlm`` field) still read."""

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

from linlm.errors import CheckpointError, ConfigError  # noqa: E402
from linlm.hf.configuration import CONFIG_CLASSES, DEFAULT_PRESET, HF_NAMES, hf_config_for, hf_name  # noqa: E402
from linlm.hf.modeling import MODEL_CLASSES, to_hf  # noqa: E402
from linlm.models.archs.tnl import TNLOptions  # noqa: E402
from linlm.models.model_config import ModelConfig  # noqa: E402
from linlm.models.presets import preset_config  # noqa: E402
from linlm.models.registry import ARCHITECTURES  # noqa: E402
from hf_helpers import tiny  # noqa: E402

ARCHS = sorted(ARCHITECTURES)
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=96,
            max_position_embeddings=128, chunk_size=16)


def saved(arch, tmp_path, **kw):
    """(model, its save_pretrained directory)."""
    model = tiny(arch, **kw)
    to_hf(model).save_pretrained(tmp_path / "hf")
    return model, tmp_path / "hf"


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, **changes}))


@pytest.mark.parametrize("arch", ARCHS)
def test_for_model_then_from_config_builds_exactly_that_model(arch):
    cfg = transformers.AutoConfig.for_model(f"linlm_{arch}", **TINY)
    hf = transformers.AutoModelForCausalLM.from_config(cfg)
    assert type(hf) is MODEL_CLASSES[arch]
    # Every setting not given is the preset's.
    assert hf.model.config == preset_config(arch, DEFAULT_PRESET, d_model=32, n_layers=2, n_heads=2, glu_dim=64,
                                            vocab_size=96, max_seq_len=128, chunk_size=16)
    assert len(hf.model.layers) == 2 and hf.model.embed.weight.shape == (96, 32)


@pytest.mark.parametrize("arch", ARCHS)
def test_defaults_are_the_preset_and_each_setting_is_one_attribute(arch):
    cfg = CONFIG_CLASSES[arch]()
    assert cfg.to_linlm() == preset_config(arch, DEFAULT_PRESET)
    keys = set(cfg.to_dict())
    assert "linlm" not in keys and not keys & set(HF_NAMES)  # the linlm names are aliases, never stored
    scratch = CONFIG_CLASSES[arch]()
    options = {f for f in ARCHITECTURES[arch].options.__dataclass_fields__}
    mine = {*(f.name for f in dataclasses.fields(ModelConfig)), *options}
    for linlm_name, name in HF_NAMES.items():  # a field or an option of this architecture: under its HF name
        assert (name in keys) is (linlm_name in mine)
        if linlm_name in mine:
            setattr(scratch, linlm_name, 3)
            assert getattr(scratch, name) == 3
    cfg.n_layers = 5
    assert cfg.num_hidden_layers == 5 and cfg.to_linlm().n_layers == 5
    assert transformers.AutoConfig.for_model(f"linlm_{arch}", d_model=48).hidden_size == 48
    assert {hf_name(f"options.{o}") for o in options} <= keys


def test_options_are_plain_attributes():
    cfg = transformers.AutoConfig.for_model("linlm_tnl", **TINY, slopes="pow2", v_silu=False)
    assert (cfg.slopes, cfg.v_silu) == ("pow2", False)
    assert transformers.AutoModelForCausalLM.from_config(cfg).model.config.options == TNLOptions("pow2", False)
    with pytest.raises(ConfigError, match=r"^slopes: unknown rule 'cubic'"):
        transformers.AutoConfig.for_model("linlm_tnl", **TINY, slopes="cubic").to_linlm()


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_config_for_gives_back_the_linlm_config(arch):
    cfg = tiny(arch).config
    assert hf_config_for(cfg).to_linlm() == cfg


def test_an_impossible_setting_names_its_attribute():
    cfg = transformers.AutoConfig.for_model("linlm_hgrn2", **{**TINY, "hidden_size": 30, "num_attention_heads": 4})
    with pytest.raises(ConfigError, match=r"^hidden_size: 30 is not divisible by n_heads=4"):
        transformers.AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layers", [3, 1])
def test_a_layer_count_other_than_the_weights_is_refused(arch, layers, tmp_path):
    _, path = saved(arch, tmp_path)  # 2 layers
    edit_json(path / "config.json", num_hidden_layers=layers)
    what = "missing from the weights" if layers > 2 else "in the weights but not in the model"
    with pytest.raises(CheckpointError, match=rf"config.json does not describe these weights \({what}: "
                                              rf"model\.layers\.{min(layers, 2)}\."):
        transformers.AutoModelForCausalLM.from_pretrained(path)


def test_a_width_other_than_the_weights_is_refused(tmp_path):
    import logging

    _, path = saved("llama", tmp_path)
    edit_json(path / "config.json", hidden_size=32)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    log = logging.getLogger("transformers.modeling_utils")
    log.addHandler(handler)
    try:
        with pytest.raises(CheckpointError, match=r"of another shape in the weights than in the model: "
                                                  r"model\.embed\.weight \(512, 64\) vs \(512, 32\)"):
            MODEL_CLASSES["llama"].from_pretrained(path, ignore_mismatched_sizes=True)  # refused all the same
    finally:
        log.removeHandler(handler)
    # The refusal is linlm's one error: transformers' table of re-initialised tensors is not printed before it.
    assert not any("LOAD REPORT" in m for m in seen) and not any("Reinit" in m for m in seen)


@pytest.mark.parametrize("change", ["missing", "extra"])
def test_missing_or_extra_tensors_are_refused(change, tmp_path):
    _, path = saved("mamba", tmp_path)
    tensors = load_file(path / "model.safetensors")
    if change == "missing":
        del tensors["model.layers.1.mixer.A_log"]
        want = r"missing from the weights: model\.layers\.1\.mixer\.A_log\)"
    else:
        tensors["model.layers.1.mixer.extra"] = torch.zeros(3)
        want = r"in the weights but not in the model: model\.layers\.1\.mixer\.extra\)"
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=want):
        transformers.AutoModelForCausalLM.from_pretrained(path)


def test_a_setting_given_twice_with_two_values_is_refused(tmp_path):
    _, path = saved("tnl", tmp_path)
    edit_json(path / "config.json", n_layers=3)
    with pytest.raises(CheckpointError, match=r"num_hidden_layers=2 and n_layers=3 are one setting"):
        transformers.AutoModelForCausalLM.from_pretrained(path)


def head_format(cfg):
    """config.json as linlm wrote it while its config classes nested the ModelConfig in one ``linlm`` field: that
    field, vocab_size, hidden_size and num_hidden_layers copied from it, and tie_word_embeddings always false."""
    return {"architectures": [f"Linlm{cfg.arch.capitalize()}ForCausalLM"], "dtype": "float32",
            "hidden_size": cfg.d_model, "linlm": cfg.to_dict(), "model_type": f"linlm_{cfg.arch}",
            "num_hidden_layers": cfg.n_layers, "tie_word_embeddings": False,
            "transformers_version": transformers.__version__, "use_cache": True, "vocab_size": cfg.vocab_size}


@pytest.mark.parametrize("arch", ARCHS)
def test_a_config_json_of_the_nested_format_still_loads(arch, tmp_path):
    model, path = saved(arch, tmp_path)
    (path / "config.json").write_text(json.dumps(head_format(model.config)))
    back = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    assert back.model.config == model.config and back.config.tie_word_embeddings  # the nested config wins
    ids = torch.randint(0, 512, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids), rtol=0, atol=0)
    back.save_pretrained(tmp_path / "again")  # written in today's format
    data = json.loads((tmp_path / "again" / "config.json").read_text())
    assert "linlm" not in data and data["hidden_size"] == 64 and data["num_hidden_layers"] == 2


def test_a_nested_config_with_flat_options_still_loads(tmp_path):
    # Six heads: TNL's two slope rules differ (they agree when the head count is a power of two).
    model, path = saved("tnl", tmp_path, d_model=48, n_heads=6, options={"slopes": "pow2", "v_silu": False})
    data = head_format(model.config)
    flat = {k: v for k, v in data["linlm"].items() if k != "options"}
    data["linlm"] = {**flat, "tpe": True, "tnl_slopes": "pow2", "tnl_v_silu": False,
                     "cosformer2_gate_before_norm": True}
    (path / "config.json").write_text(json.dumps(data))
    back = MODEL_CLASSES["tnl"].from_pretrained(path).eval()
    assert back.model.config.options == TNLOptions("pow2", False)
    ids = torch.randint(0, 512, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids), rtol=0, atol=0)


def test_a_nested_config_of_another_architecture_is_refused(tmp_path):
    model, path = saved("tnl", tmp_path)
    data = head_format(model.config)
    data["linlm"]["arch"] = "hgrn2"
    (path / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"linlm 'hgrn2' model, but this class builds 'tnl'"):
        transformers.AutoModelForCausalLM.from_pretrained(path)


def test_an_option_missing_from_config_json_takes_its_value_from_before_it_existed(tmp_path):
    model, path = saved("tnl", tmp_path, options={"slopes": "pow2", "v_silu": False})
    data = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({k: v for k, v in data.items() if k not in ("slopes", "v_silu")}))
    back = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert back.model.config.options == TNLOptions(**ARCHITECTURES["tnl"].saved_before)


def test_the_flat_spelling_of_an_option_is_an_alias():
    cfg = transformers.AutoConfig.for_model("linlm_tnl", **TINY, tnl_slopes="pow2")
    assert cfg.slopes == "pow2" and cfg.tnl_slopes == "pow2" and "tnl_slopes" not in cfg.to_dict()
