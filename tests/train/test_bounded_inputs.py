"""`linlm train` on inputs that used to be taken silently or to crash: --resume of nothing, a batch too large for
memory, a seed numpy refuses; and the stop message, which names a command that continues the run."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml
from output_asserts import one_line_error
from train_helpers import tiny_config_dict, write_yaml

from linlm.cli import main
from linlm.train.trainer import TrainHooks, train


@pytest.mark.parametrize("config", [False, True])
def test_resume_of_a_directory_without_a_run_is_refused(tmp_path, tiny_data, capsys, config):
    out = tmp_path / "typo"
    argv = ["train", "--resume", "--out", str(out), "--quiet"]
    if config:  # with a config too: still nothing to resume, and no new run is started there
        argv += ["--config", str(write_yaml(tmp_path / "c.yaml", tiny_config_dict(tiny_data, out)))]
    assert main(argv) == 2
    one_line_error(capsys.readouterr().err, f"--resume: {out} does not exist, so there is nothing to resume")
    assert not out.exists()
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(argv) == 2
    one_line_error(capsys.readouterr().err, "holds no run that linlm wrote")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_batch_too_large_for_memory_is_refused_with_the_estimate_before_anything(tmp_path, tiny_data, capsys):
    from linlm.resources import available_memory

    out = tmp_path / "run"
    path = write_yaml(tmp_path / "c.yaml", tiny_config_dict(tiny_data, out))
    assert main(["train", "--config", str(path), "--batch-size", "1048576", "--seq-len", "128", "--quiet"]) == 2
    line = one_line_error(capsys.readouterr().err, "batch_size 1048576 (micro-batches of 1048576 x 128 tokens)",
                          "needs at least", "is available (", "lower batch_size")
    assert available_memory()[0] is not None and "GiB of memory" in line
    assert not out.exists()


@pytest.mark.parametrize("argv, expected", [
    (["--seed", "4294967296"], "argument --seed: expected a whole number from 0 to 4294967295"),
    (["seed=4294967296"], "seed: must be a whole number from 0 to 4294967295, got 4294967296"),
    (["--batch-size", "1000000000"], "argument --batch-size: expected a whole number from 1 to 1048576"),
    (["steps=1000000000000"], "steps: must be a whole number from 1 to 1e9"),
])
def test_a_number_beyond_its_range_is_refused_however_it_is_given(tmp_path, capsys, argv, expected):
    assert main(["train", "--config", "demo", "--out", str(tmp_path / "r"), *argv]) == 2
    one_line_error(capsys.readouterr().err, expected)
    assert not (tmp_path / "r").exists()


class _Interrupt(TrainHooks):
    """Ctrl-C after the second step, as a user would press it."""

    def on_step(self, record: dict) -> None:
        if record.get("step") == 2:
            os.kill(os.getpid(), signal.SIGINT)


def test_the_stop_message_names_a_command_that_continues_the_run(make_config, capsys):
    cfg = make_config("run", steps=6)
    result = train(cfg, verbose=True, live=False, hooks=_Interrupt())
    assert result.interrupted == "SIGINT" and result.step < 6
    said = capsys.readouterr()
    hint = f"continue with: linlm train --resume --out {cfg.out_dir}"
    assert hint in said.out + said.err
    # the command it names continues the run (demo has no --resume: its runs are continued this way too)
    assert main(hint.split(": ", 1)[1].split()[1:] + ["--quiet"]) == 0
    out = Path(cfg.out_dir)
    assert yaml.safe_load((out / "config.yaml").read_text())["steps"] == 6
    assert json.loads((out / "summary.json").read_text())["step"] == 6
