"""Config validation: unknown keys, wrong types and impossible values fail before any work, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import REPO, write_yaml

from linlm.cli import main
from linlm.errors import ConfigError
from linlm.train.train_config import TrainConfig
from linlm.train.config_sources import build_config, config_path, load_train_config


def test_defaults_validate():
    cfg = TrainConfig().validate()
    assert cfg.optim.betas == [0.9, 0.95]


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "configs").glob("*.yaml")))
def test_shipped_configs_validate(name):
    cfg = load_train_config(config_path(name))
    assert cfg.steps > 0


def test_overrides_take_precedence_over_the_file(tmp_path):
    path = write_yaml(tmp_path / "c.yaml", {"steps": 50, "optim": {"lr": 0.1}, "schedule": {"warmup_steps": 5}})
    cfg = load_train_config(path, ["optim.lr=0.002", "schedule.kind=wsd", "optim.betas=[0.8, 0.9]"])
    assert cfg.steps == 50 and cfg.optim.lr == 0.002 and cfg.schedule.kind == "wsd"
    assert cfg.optim.betas == [0.8, 0.9]


def test_unknown_key_in_a_file_names_file_line_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("steps: 10\noptim:\n  lr: 0.001\n  lrr: 0.002\n")
    with pytest.raises(ConfigError) as e:
        load_train_config(path)
    msg = str(e.value)
    assert "optim.lrr" in msg and f"{path}:4" in msg and "optim.lr" in msg  # the valid keys are listed


def test_wrong_type_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"optim\.lr.*expected a number.*command line"):
        load_train_config(None, ["optim.lr=fast"])
    with pytest.raises(ConfigError, match=r"schedule\.kind"):
        load_train_config(None, ["schedule.kind=linear"])
    with pytest.raises(ConfigError, match=r"^steps"):
        load_train_config(None, ["steps=-3"])


def test_impossible_values():
    with pytest.raises(ConfigError, match="batch_size.*grad_accum"):
        build_config(None, {"batch_size": 6, "grad_accum": 4})
    with pytest.raises(ConfigError, match=r"model\.overrides\.d_model"):
        build_config(None, {"model": {"overrides": {"d_model": 100, "n_heads": 3}}})
    with pytest.raises(ConfigError, match=r"model\.overrides.*unknown key 'd_modle'"):
        build_config(None, {"model": {"overrides": {"d_modle": 64}}})
    with pytest.raises(ConfigError, match=r"model\.arch"):
        build_config(None, {"model": {"arch": "gpt5"}})
    with pytest.raises(ConfigError, match=r"data\.seq_len.*max_seq_len"):
        build_config(None, {"data": {"seq_len": 4096}, "model": {"overrides": {"max_seq_len": 1024}}})
    with pytest.raises(ConfigError, match=r"schedule\.warmup_steps"):
        build_config(None, {"steps": 10, "schedule": {"warmup_steps": -1}})
    with pytest.raises(ConfigError, match=r"optim\.betas"):
        build_config(None, {"optim": {"betas": [0.9, 1.5]}})


def test_cli_unknown_key_exits_2_without_traceback(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "optim.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert "optim.lrr" in err and "Traceback" not in err
    assert not out.exists()


def test_cli_missing_config_file(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_cli_print_config_round_trips(tmp_path, capsys):
    assert main(["train", "--config", "demo", "--steps", "70", "--set", "optim.lr=0.01", "--print-config"]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "printed.yaml"
    path.write_text(text)
    cfg = load_train_config(path)
    assert cfg.steps == 70 and cfg.optim.lr == 0.01 and cfg.model.arch == "tnl"
    assert cfg.to_dict() == load_train_config(config_path("demo"), ["steps=70", "optim.lr=0.01"]).to_dict()


def test_config_path_finds_named_configs():
    assert config_path("demo") == REPO / "configs" / "demo.yaml"
    assert config_path("no-such-config") is None
    assert config_path(str(Path("x") / "demo.yaml")) is None


def test_check_command_keeps_the_decode_table(capsys):
    assert main(["check", "--archs", "llama", "tnl"]) == 0
    out = capsys.readouterr().out
    assert "llama" in out and "tnl" in out and "matches the full pass" in out


def test_demo_command_trains(monkeypatch):
    """`linlm demo` is the training demo now; its arguments reach run_demo (stubbed: the real one takes minutes)."""
    import linlm.commands.demo

    seen = {}

    class Result:
        interrupted = None

    def fake_run_demo(**kwargs):
        seen.update(kwargs)
        return Result()

    monkeypatch.setattr(linlm.commands.demo, "run_demo", fake_run_demo)
    assert main(["demo", "--steps", "5", "--out", "x", "optim.lr=0.1"]) == 0
    assert seen["steps"] == 5 and seen["out_dir"] == "x" and seen["overrides"] == ["optim.lr=0.1"]
    assert seen["preset"] is None


def test_the_tokenizer_too_large_hint_is_a_command_that_works(make_config, capsys):
    """The hint's --set KEY=VALUE, added to the refused command line, makes `linlm train` accept it."""
    import re

    cfg = make_config("run")
    args = ["train", "--data-dir", str(cfg.data.dir), "--out", str(cfg.out_dir), "--quiet",
            "model.overrides={n_layers: 1, d_model: 32, n_heads: 2, max_seq_len: 128, vocab_size: 256}",
            "data.seq_len=32", "batch_size=4", "steps=1", "eval.every=0", "samples.max_new_tokens=0", "threads=1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    hint = re.search(r"--set (\S+?)\)", err)
    assert hint, err
    assert main(args + ["--set", hint.group(1)]) == 0, capsys.readouterr().err


def test_resumable_keys_are_read_from_the_fields():
    import dataclasses

    from linlm.train.train_config import is_resumable_change

    import typing

    def all_keys(cls, prefix=""):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                yield from all_keys(hints[f.name], f"{prefix}{f.name}.")
            else:
                yield prefix + f.name

    resumable = {k for k in all_keys(TrainConfig) if is_resumable_change(k)}
    sections = ("samples.", "distributed.", "debug.")
    expected = {"out_dir", "steps", "eval.every", "checkpoint.every", "checkpoint.keep", "checkpoint.keep_every_tokens",
                "checkpoint.keep_log", "log_every", "device",
                "compile", "threads", "peak_flops", "activation_checkpointing", "max_bad_steps", "data.dir",
                "deterministic"}
    assert {k for k in resumable if not k.startswith(sections)} == expected
    assert all(is_resumable_change(k) for k in all_keys(TrainConfig) if k.startswith(sections))
    assert is_resumable_change("samples.prompts[1]") and is_resumable_change("samples")
    for key in ("optim.lr", "model.overrides", "model.overrides.vocab_size", "data.seq_len", "seed", "init_from",
                "data.document_resets", "no.such.key", "steps.extra"):
        assert not is_resumable_change(key), key
