"""An architecture's own options live in ModelConfig.options; their earlier flat spellings keep working.

Saved models and checkpoints of the flat format load and compute exactly what they did; YAML configs and
``model.overrides.tnl_v_silu=false`` overrides mean what they meant, and their errors name the key as it was written.
"""

import json

import pytest
import torch

import linlm
from linlm.schema import parse_overrides
from linlm.errors import ConfigError
from linlm.models.archs.base import ArchSpec, NoOptions
from linlm.models.archs.cosformer2 import CosFormer2Options
from linlm.models.archs.hgrn2 import HGRN2Options
from linlm.models.archs.llama import LlamaOptions
from linlm.models.archs.mamba import MambaOptions
from linlm.models.archs.tnl import TNLMixer, TNLOptions
from linlm.models.model_config import ModelConfig, model_keys, resume_options
from linlm.models.format import config_checksum
from linlm.models.lm import CausalLM, create_model
from linlm.models.registry import ARCHITECTURES
from linlm.train.config_sources import build_config, build_model_config, load_train_config

# A model config as linlm wrote it in config.json before options were nested: every option a flat field, those of
# every architecture in every config. Written out by hand, not by the code under test.
FLAT = {
    "arch": "tnl", "vocab_size": 64, "d_model": 48, "n_layers": 2, "n_heads": 6, "glu_dim": 64, "max_seq_len": 256,
    "norm_eps": 1e-6, "rope_theta": 10000.0, "n_kv_heads": 0, "tie_embeddings": True, "rope_scaling": "none",
    "rope_factor": 8.0, "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0, "rope_original_max_len": 8192,
    "chunk_size": 8, "init_std": 0.02, "tpe": True, "norm_type": "auto", "tnl_slopes": "alibi", "tnl_v_silu": True,
    "cosformer2_gate_before_norm": True, "d_state": 16, "d_conv": 4, "expand": 2, "dt_rank": 0, "ssm_experts": 4,
    "ssm_top_k": 2, "mlp_experts": 8, "mlp_top_k": 2, "mlp_expert_dim": 0, "shared_experts": 0,
    "ssm_policy": "routed", "ssm_kernel": "s6", "balance_loss_coef": 0.01, "router_z_loss_coef": 0.0,
}


def _write_flat(directory, flat: dict) -> None:
    """Replace a saved model's config.json by one of the flat format, checksum and all (format version 2)."""
    meta = json.loads((directory / "config.json").read_text())
    meta["config"], meta["config_sha256"] = flat, config_checksum(flat)
    (directory / "config.json").write_text(json.dumps(meta, indent=2))


@pytest.mark.parametrize("arch,flat_options,options", [
    ("tnl", {"tnl_slopes": "pow2", "tnl_v_silu": False}, TNLOptions("pow2", False)),
    ("tnl", {"tnl_slopes": "alibi", "tnl_v_silu": True, "tpe": False}, TNLOptions("alibi", True)),
    ("cosformer2", {"cosformer2_gate_before_norm": False, "tpe": False}, CosFormer2Options(False, False)),
    ("hgrn2", {"tnl_v_silu": False, "tpe": False}, HGRN2Options()),  # the paper's model
])
def test_a_model_saved_in_the_flat_format_loads_and_computes_the_same(tmp_path, arch, flat_options, options):
    flat = {**FLAT, "arch": arch, **flat_options}
    model = CausalLM(ModelConfig.from_dict({k: v for k, v in flat.items()})).eval()
    assert model.config.options == options  # the flat spelling given to from_dict means the same
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save(tmp_path / "m")
    _write_flat(tmp_path / "m", flat)

    loaded = linlm.load(tmp_path / "m").eval()
    assert loaded.config.options == options and loaded.config == model.config
    ids = torch.randint(0, 64, (2, 19))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))
    # Saved again, it is written in the nested format, and reads back the same.
    loaded.save(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "config.json").read_text())["config"]
    assert again["options"] == json.loads(json.dumps(model.config.to_dict()["options"]))
    assert not set(again) & {"tpe", "tnl_slopes", "tnl_v_silu", "cosformer2_gate_before_norm"}
    assert linlm.load(tmp_path / "again").config == model.config


def test_flat_options_of_the_own_architecture_decide_what_tnl_computes():
    pow2 = create_model("tnl", preset="tiny", n_heads=6, d_model=48, tnl_slopes="pow2", tnl_v_silu=False)
    mixer = pow2.layers[0].mixer
    assert isinstance(mixer, TNLMixer) and mixer.v_silu is False
    alibi = create_model("tnl", preset="tiny", n_heads=6, d_model=48)
    assert not torch.equal(mixer.log_decay, alibi.layers[0].mixer.log_decay)  # 6 heads: the rules differ


def test_cosformer2_without_tpe_has_no_embedding_mixer():
    assert create_model("cosformer2", preset="tiny", tpe=False).embed_mixer is None
    assert create_model("cosformer2", preset="tiny", options={"tpe": False}).embed_mixer is None
    assert create_model("cosformer2", preset="tiny").embed_mixer is not None


def test_errors_name_the_key_as_it_was_spelled(monkeypatch):
    with pytest.raises(ConfigError, match=r"^tnl_v_silu: expected true or false, got 'no'$") as e:
        ModelConfig.from_dict({"arch": "tnl", "tnl_v_silu": "no"})
    assert e.value.key == "tnl_v_silu"
    with pytest.raises(ConfigError, match=r"^options.v_silu: expected true or false, got 'no'$") as e:
        ModelConfig.from_dict({"arch": "tnl", "options": {"v_silu": "no"}})
    assert e.value.key == "options.v_silu"
    # Another architecture's flat option is checked for its type, as it always was, and otherwise ignored.
    with pytest.raises(ConfigError, match=r"^cosformer2_gate_before_norm: expected true or false, got 1$"):
        ModelConfig.from_dict({"arch": "llama", "cosformer2_gate_before_norm": 1})
    assert ModelConfig.from_dict({"arch": "llama", "tnl_slopes": "linear"}).options == LlamaOptions()
    with pytest.raises(ConfigError, match=r"^options.slopes: unknown key 'slopes'; valid keys here are: 'head_dim', 'n_kv_heads'"):
        ModelConfig.from_dict({"arch": "llama", "options": {"slopes": "pow2"}})
    # An architecture without options of its own says so.
    monkeypatch.setitem(ARCHITECTURES, "plain", ArchSpec("plain", TNLMixer, None, "rms", "no options"))
    assert ModelConfig.from_dict({"arch": "plain", "tnl_slopes": "linear"}).options == NoOptions()
    with pytest.raises(ConfigError, match=r"^options.slopes: unknown key 'slopes'; architecture 'plain' has no "):
        ModelConfig.from_dict({"arch": "plain", "options": {"slopes": "pow2"}})
    with pytest.raises(ConfigError, match=r"^options.slope: unknown key 'slope'; did you mean 'slopes'\?"):
        ModelConfig.from_dict({"arch": "tnl", "options": {"slope": "pow2"}})
    with pytest.raises(ConfigError, match=r"^options: got 'pow2', expected a mapping of TNLOptions keys$"):
        ModelConfig.from_dict({"arch": "tnl", "options": "pow2"})


def test_replace_keeps_merges_or_resets_the_options():
    cfg = ModelConfig.from_dict({"arch": "tnl", "options": {"slopes": "pow2", "v_silu": False}})
    assert cfg.replace(d_model=64, n_heads=2).options == TNLOptions("pow2", False)
    assert cfg.replace(options={"v_silu": True}).options == TNLOptions("pow2", True)
    assert cfg.replace(tnl_v_silu=True).options == TNLOptions("pow2", True)
    assert cfg.replace(arch="cosformer2").options == CosFormer2Options()  # the new architecture's defaults
    assert cfg.replace(arch="hgrn2").options == HGRN2Options()
    assert cfg.replace(arch="mamba").options == MambaOptions()


def test_yaml_configs_and_overrides_take_both_spellings(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("model:\n  arch: tnl\n  overrides:\n    tnl_v_silu: false\n    tnl_slopes: pow2\n")
    new = tmp_path / "new.yaml"
    new.write_text("model:\n  arch: tnl\n  overrides:\n    options: {v_silu: false, slopes: pow2}\n")
    want = TNLOptions("pow2", False)
    assert load_train_config(old).model_config(64).options == want == load_train_config(new).model_config(64).options
    assert load_train_config(None, ["model.arch=tnl", "model.overrides.tnl_v_silu=false",
                                    "model.overrides.options.slopes=pow2"]).model_config(64).options == want
    for override in ("model.overrides.tnl_v_silu=false", "model.overrides.options.v_silu=false"):
        assert build_model_config("tnl", None, parse_overrides([override])).options == TNLOptions("alibi", False)


def test_a_bad_option_in_yaml_is_located_in_its_spelling(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  arch: tnl\n  overrides:\n    d_model: 64\n    tnl_slopes: linear\n")
    with pytest.raises(ConfigError, match=rf"^{path}:5: model.overrides.tnl_slopes: unknown rule 'linear'"):
        load_train_config(path)
    path.write_text("model:\n  arch: tnl\n  overrides:\n    options:\n      slopes: linear\n")
    with pytest.raises(ConfigError, match=rf"^{path}:5: model.overrides.options.slopes: unknown rule 'linear'"):
        load_train_config(path)


def test_a_flat_option_outside_model_overrides_names_its_place():
    assert {"tnl_v_silu", "tpe", "options", "d_model"} <= model_keys()
    with pytest.raises(ConfigError, match=r"model fields are set as model.overrides.tnl_v_silu=false"):
        build_config(None, {"tnl_v_silu": False})


def test_resume_keeps_the_values_a_checkpoint_predates():
    cfg = ModelConfig.from_dict({"arch": "tnl"})
    before = {k: v for k, v in FLAT.items() if k not in ("tnl_slopes", "tnl_v_silu", "cosformer2_gate_before_norm")}
    assert resume_options(cfg, before, {}).options == TNLOptions("pow2", False)
    assert resume_options(cfg, before, {"tnl_v_silu": True}).options == TNLOptions("pow2", True)
    assert resume_options(cfg, before, {"options": {"slopes": "alibi"}}).options == TNLOptions("alibi", False)
    assert resume_options(cfg, FLAT, {}).options == TNLOptions("alibi", True)  # it holds both: nothing kept
    assert resume_options(cfg, cfg.to_dict(), {}) is cfg


def test_an_arch_spec_declares_options_it_has():
    with pytest.raises(ValueError, match=r"\['v_silo'\] are not fields of TNLOptions"):
        ArchSpec("x", TNLMixer, None, "rms", "x", options=TNLOptions, flat_options={"x_v": "v_silo"})
    with pytest.raises(ValueError, match=r"\['slopes'\] are not fields of NoOptions"):
        ArchSpec("x", TNLMixer, None, "rms", "x", saved_before={"slopes": "pow2"})
