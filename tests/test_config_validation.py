"""linlm.schema: strict pydantic validation of config dataclasses, the YAML loader and dotted overrides."""

from __future__ import annotations

import math

import pytest

from linlm.schema import from_dict, load_yaml, parse_overrides
from linlm.errors import ConfigError
from linlm.models.model_config import ModelConfig
from linlm.train.train_config import TrainConfig
from linlm.train.config_sources import build_config, load_train_config


def test_yaml_that_is_not_utf8_is_a_config_error_with_its_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("steps: 10\n# r\u00e9sum\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"{path}:2: .*not UTF-8"):
        load_yaml(path)


def test_duplicate_yaml_keys_are_refused_naming_both_lines(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("steps: 10\noptim:\n  lr: 0.1\n  eps: 1.0e-8\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match=r"'lr' is given twice \(lines 3 and 5\)") as e:
        load_yaml(path)
    assert str(e.value).startswith(f"{path}:5:")
    with pytest.raises(ConfigError, match="given twice"):
        parse_overrides(["model.overrides={d_model: 32, d_model: 64}"])


def test_yaml_numbers_follow_yaml_1_2(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 6e-4\n  eps: 1E-8\n")
    cfg = load_train_config(path)
    assert cfg.optim.lr == 6e-4 and cfg.optim.eps == 1e-8
    assert parse_overrides(["a=1e3", "b=nan", "c=-inf", "d=.inf", "e=nano"]) == {
        "a": 1000.0, "b": pytest.approx(math.nan, nan_ok=True), "c": -math.inf, "d": math.inf, "e": "nano"}


@pytest.mark.parametrize("data, key, expected", [
    ({"norm_eps": math.nan}, "norm_eps", "finite number"),
    ({"init_std": math.inf}, "init_std", "finite number"),
    ({"rope_theta": -math.inf}, "rope_theta", "finite number"),
    ({"vocab_size": "512"}, "vocab_size", "expected an integer, got '512'"),
    ({"vocab_size": 512.0}, "vocab_size", "expected an integer, got 512.0"),
    ({"tpe": "true"}, "tpe", "expected true or false"),
    ({"n_layers": True}, "n_layers", "expected an integer"),
    ({"arch": 3}, "arch", "expected a string"),
])
def test_model_config_types_are_strict_and_floats_finite(data, key, expected):
    with pytest.raises(ConfigError, match=expected) as e:
        ModelConfig.from_dict(data)
    assert e.value.key == key and str(e.value).startswith(f"{key}: ")


def test_an_integer_is_a_number_and_defaults_fill_the_rest():
    cfg = ModelConfig.from_dict({"init_std": 1, "d_model": 64, "n_heads": 2})
    assert cfg.init_std == 1.0 and isinstance(cfg.init_std, float) and cfg.vocab_size == ModelConfig().vocab_size


def test_non_finite_floats_are_refused_when_validating_a_built_config():
    with pytest.raises(ConfigError, match="norm_eps: must be a positive finite number, got nan"):
        ModelConfig(norm_eps=math.nan).validate()
    with pytest.raises(ConfigError, match="init_std"):
        ModelConfig(init_std=math.inf).validate()


def test_unknown_key_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"unknown key 'vocab_sise'; did you mean 'vocab_size'\?") as e:
        ModelConfig.from_dict({"vocab_sise": 5})
    assert e.value.key == "vocab_sise"


@pytest.mark.parametrize("text, key", [
    ("optim:\n  lr: .inf\n", "optim.lr"),
    ("optim:\n  betas: [0.9, .nan]\n", "optim.betas[1]"),
    ("peak_flops: .inf\n", "peak_flops"),
    ("model:\n  overrides:\n    norm_eps: .nan\n", "model.overrides.norm_eps"),
])
def test_non_finite_numbers_in_a_file_are_refused_with_file_and_line(tmp_path, text, key):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    line = text.count("\n")  # the key is on the last line
    with pytest.raises(ConfigError, match="finite") as e:
        load_train_config(path)
    assert str(e.value).startswith(f"{path}:{line}: {key}: ")


@pytest.mark.parametrize("text, key, expected", [
    ("steps: '100'\n", "steps", "expected an integer, got '100'"),
    ("steps: 100.0\n", "steps", "expected an integer, got 100.0"),
    ("compile: 'yes'\n", "compile", "expected true or false, got 'yes'"),
    ("optim: 3\n", "optim", "expected a mapping of OptimSection keys, got 3"),
    ("schedule:\n  kind: linear\n", "schedule.kind", "expected one of 'cosine', 'constant' or 'wsd'"),
])
def test_train_config_types_are_strict(tmp_path, text, key, expected):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=expected) as e:
        load_train_config(path)
    assert f"{path}:{text.count(chr(10))}: {key}: " in str(e.value)


def test_errors_are_one_line_and_name_the_command_line():
    with pytest.raises(ConfigError) as e:
        load_train_config(None, ["optim.lr=.inf"])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("optim.lr: ") and "inf" in msg and msg.endswith("(set on the command line)")


def test_cross_field_error_points_at_the_line_of_each_key_the_user_set(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("steps: 10\nbatch_size: 16\noptim:\n  lr: 0.01\ngrad_accum: 3\n")
    with pytest.raises(ConfigError, match="not divisible") as e:
        load_train_config(path)
    assert f"grad_accum at {path}:5" in str(e.value)
    # the key the message leads with was left at its default: blame the line the user did write
    path.write_text("model:\n  arch: llama\n  overrides:\n    n_heads: 3\n")
    with pytest.raises(ConfigError, match="d_model: 512 is not divisible by n_heads=3") as e:
        load_train_config(path)
    assert str(e.value).startswith(f"{path}:4: ")
    # one key in the file, the other on the command line: both are named
    path.write_text("batch_size: 16\n")
    with pytest.raises(ConfigError) as e:
        load_train_config(path, ["grad_accum=3"])
    assert str(e.value).startswith(f"{path}:1: batch_size") and "grad_accum set on the command line" in str(e.value)


def test_old_model_key_spelling_names_the_new_one():
    with pytest.raises(ConfigError, match=r"model\.overrides\.vocab_size=8192"):
        build_config(None, {"vocab_size": 8192})
    with pytest.raises(ConfigError, match=r"model\.arch=tnl"):
        load_train_config(None, ["arch=tnl"])


def test_from_dict_takes_paths_and_tuples_and_refuses_other_objects(tmp_path):
    cfg = TrainConfig.from_dict({"out_dir": tmp_path / "run", "optim": {"betas": (0.8, 0.9)}})
    assert cfg.out_dir == str(tmp_path / "run") and cfg.optim.betas == [0.8, 0.9]
    with pytest.raises(ConfigError, match=r"^steps: .*not a config value"):
        from_dict(TrainConfig, {"steps": object()})


def test_a_number_given_for_text_says_how_to_quote_it():
    with pytest.raises(ConfigError, match=r"out_dir: expected a string, got 2024; YAML reads 2024 as an integer: "
                                          r"quote it") as e:
        load_train_config(None, ["out_dir=2024"])
    assert str(e.value).endswith("(set on the command line)")
    assert load_train_config(None, ['out_dir="2024"']).out_dir == "2024"
