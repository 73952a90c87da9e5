"""`linlm scaling run --set`: the keys a ladder owns run by run are refused by name, every other key reaches every
run's config; --dry-run runs the real run's checks and writes nothing; a flag that only shapes --dry-run's estimate
is refused without it; a sweep that cannot fit in memory is refused before any run trains."""

from __future__ import annotations

import pytest
import yaml
from output_asserts import one_line_error

from linlm.cli import main


def tiny_ladder(path, source) -> str:
    data = {"name": "tiny", "archs": ["llama"], "max_epochs": 1000,
            "train": {"data": {"source": str(source), "tokenizer": "bpe:300", "seq_len": 16}, "batch_size": 4,
                      "eval": {"every": 0}, "samples": {"prompts": []}, "peak_flops": 1.0e11, "threads": 1},
            "rungs": [{"name": "xs", "model": {"n_layers": 1, "d_model": 16, "n_heads": 1}, "tokens": 128}]}
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("override, key", [
    ("steps=5", "steps"), ("model.arch=tnl", "model.arch"), ("model.overrides.d_model=64", "model.overrides.d_model"),
    ("model.overrides.n_layers=3", "model.overrides.n_layers"), ("model.preset=tiny", "model.preset"),
    ("seed=3", "seed"), ("out_dir=elsewhere", "out_dir"), ("model={arch: tnl}", "model.arch"),
    ("model.overrides.n_heads=1", "model.overrides.n_heads"),  # smoke's rungs differ in it
])
@pytest.mark.parametrize("mode", [["--dry-run", "--no-measure"], ["--emit", "torchrun"], []])
def test_a_key_the_ladder_owns_is_refused_by_name(tmp_path, capsys, override, key, mode):
    out = tmp_path / "sweep"
    argv = ["scaling", "run", "--ladder", "smoke", "--archs", "llama", "--out", str(out), "--set", override, *mode]
    assert main(argv) == 2
    one_line_error(capsys.readouterr().err, f"--set {key}: ladder smoke sets", "nothing was changed")
    assert not out.exists() and not (tmp_path / "elsewhere").exists()


def test_what_a_ladder_owns():
    from linlm.scaling.ladder import load_ladder, owned_keys

    owned = owned_keys(load_ladder("smoke"))
    assert {"model.arch", "model.overrides.d_model", "model.overrides.n_layers", "steps", "out_dir", "seed",
            "model.overrides.n_heads"} <= set(owned)
    # the same in every rung: a setting of the ladder, which --set may change for every run
    assert "model.overrides.max_seq_len" not in owned and "optim.lr" not in owned


def test_any_other_key_reaches_every_run_and_its_config(tmp_path, text_file, capsys):
    ladder = tiny_ladder(tmp_path / "tiny.yaml", text_file)
    out = tmp_path / "sweep"
    argv = ["scaling", "run", "--ladder", ladder, "--out", str(out), "--set", "optim.weight_decay=0.05",
            "--set", "optim.lr=0.004", "--set", "model.overrides.chunk_size=8"]
    assert main(argv) == 0
    saved = yaml.safe_load((out / "runs" / "llama-xs" / "config.yaml").read_text())
    assert saved["optim"]["weight_decay"] == 0.05 and saved["optim"]["lr"] == 0.004
    assert saved["model"]["overrides"]["chunk_size"] == 8
    # and the ladder's own keys are the ladder's: 128 tokens / (4 x 16) = 2 steps, llama at rung xs
    assert saved["steps"] == 2 and saved["model"]["arch"] == "llama" and saved["model"]["overrides"]["d_model"] == 16


def test_emit_with_dry_run_prints_the_commands_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["scaling", "run", "--ladder", "smoke", "--archs", "llama", "--out", str(out), "--emit", "torchrun"]
    assert main([*argv, "--dry-run"]) == 0
    dry = capsys.readouterr()
    assert not out.exists() and "nothing written" in dry.err
    assert main(argv) == 0
    assert capsys.readouterr().out == dry.out  # the same commands, now with their configs written
    assert (out / "configs" / "llama-xs.yaml").is_file()


def test_dry_run_runs_the_checks_of_out_the_real_run_runs(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["scaling", "run", "--ladder", "paper", "--archs", "llama", "--out", str(out), "--emit",
                 "torchrun"]) == 0
    capsys.readouterr()
    # a sweep of another ladder is there: the real run refuses it, and so does its dry run
    assert main(["scaling", "run", "--ladder", "smoke", "--out", str(out), "--dry-run", "--no-measure"]) == 2
    one_line_error(capsys.readouterr().err, "holds a sweep of ladder 'paper', not 'smoke'")


@pytest.mark.parametrize("flags", [["--no-measure"], ["--flops-per-s", "1e15"]])
def test_an_estimate_flag_without_dry_run_is_refused(tmp_path, capsys, flags):
    out = tmp_path / "sweep"
    assert main(["scaling", "run", "--ladder", "smoke", "--out", str(out), *flags]) == 2
    one_line_error(capsys.readouterr().err, f"{flags[0]}: only changes the estimate of --dry-run")
    assert not out.exists()


def test_a_sweep_too_large_for_memory_is_refused_before_any_run(tmp_path, text_file, capsys, monkeypatch):
    import linlm.resources

    monkeypatch.setattr(linlm.resources, "available_memory", lambda device=None: (4096, "a test"))
    out = tmp_path / "sweep"
    argv = ["scaling", "run", "--ladder", tiny_ladder(tmp_path / "tiny.yaml", text_file), "--out", str(out)]
    assert main(argv) == 2
    one_line_error(capsys.readouterr().err, "run llama-xs: batch_size 4", "needs at least", "4.0 KiB is available (a test)")
    assert not out.exists()
