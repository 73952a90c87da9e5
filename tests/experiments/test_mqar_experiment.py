"""The MQAR experiment (linlm.experiments.mqar, `linlm mqar`): resumable run by run, a stopped run never recorded,
its outputs and numbers checked before any training, and its default runs taken from the registry."""

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from linlm.cli import main
from linlm.errors import ConfigError, LockedError
from linlm.eval.mqar import IGNORE, MQARConfig, state_floats
from linlm.locking import DirLock
from linlm.train.checkpoint import list_checkpoints


def test_trainer_trains_on_mqar_and_the_experiment_reports(tmp_path, caplog):
    """The data= factory plugs into the Trainer; the experiment writes one run per model and measures it; a rerun
    reads the results back; other settings are refused before anything changes; overwrite trains again, also when
    it was stopped and is continued without overwrite."""
    from linlm import load
    from linlm.eval.mqar import mqar_data
    from linlm.experiments.mqar import RECORD_FILE, MQARRun, run_experiment
    from linlm.train import TrainData, build_config

    cfg = MQARConfig(vocab_size=32, num_kv=3)
    data = mqar_data(cfg)(build_config(None, {"batch_size": 4}), 0, 1)
    assert isinstance(data, TrainData) and data.vocab_size == 32 and data.tokenizer is None
    ids, tgt = next(data.train)
    assert ids.shape == (4, cfg.seq_len) and (tgt != IGNORE).sum() == 4 * 3
    moss = {"ssm_top_k": 1, "mlp_experts": 1, "mlp_top_k": 1}
    runs = [MQARRun("mossnet", 16, f"mossnet-E{e}-d16", {"ssm_experts": e, **moss}) for e in (1, 2)]
    kw = {"batch_size": 4, "head_dim": 8, "test_sequences": 64}
    rows = run_experiment(runs, cfg, tmp_path, steps=3, **kw)
    assert [r["name"] for r in rows] == ["mossnet-E1-d16", "mossnet-E2-d16"]
    for r in rows:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["answers"] == 64 * 3 and r["steps"] == 3
        model = load(list_checkpoints(tmp_path / r["name"] / "checkpoints")[-1][1])
        assert model.config.vocab_size == 32 and model.config.d_model == 16
        assert r["state_floats"] == state_floats(model, cfg.seq_len)
        assert json.loads((tmp_path / r["name"] / RECORD_FILE).read_text())["result"] == r
    # Two SSM experts hold more state than one at (nearly) the same active size: only the router differs.
    assert rows[1]["state_floats"] > rows[0]["state_floats"]
    assert abs(rows[1]["active_params"] - rows[0]["active_params"]) < 0.05 * rows[0]["active_params"]

    # The same experiment again: the finished runs are read back, nothing is trained or written (but the lock).
    before = snapshot(tmp_path)
    assert run_experiment(runs, cfg, tmp_path, steps=3, **kw) == rows
    assert {k: v for k, v in snapshot(tmp_path).items() if k != ".lock"} == \
        {k: v for k, v in before.items() if k != ".lock"}
    # Other settings: refused before anything is trained, with a hint this experiment can follow.
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="another experiment.*steps.*--overwrite") as e:
        run_experiment(runs, cfg, tmp_path, steps=4, **kw)
    assert "--resume" not in str(e.value)
    assert snapshot(tmp_path) == before
    # overwrite trains both again, to the new length, and drops their old results at once. Here it stops at the
    # first run (held by another process's lock); continued without overwrite, a run still replaces its old one,
    # from step 0, instead of resuming the old run's checkpoint.
    with DirLock(tmp_path / runs[0].name(), "out_dir"), pytest.raises(LockedError):
        run_experiment(runs, cfg, tmp_path, steps=4, overwrite=True, **kw)
    second = tmp_path / runs[1].name()
    record = json.loads((second / RECORD_FILE).read_text())
    assert record["result"] is None and record["settings"]["train"]["steps"] == 4
    assert [p.name for _, p in list_checkpoints(second / "checkpoints")] == ["step_00000003"]  # the old run, still
    caplog.set_level(logging.INFO, logger="linlm")
    [again] = run_experiment(runs[1:], cfg, tmp_path, steps=4, **kw)
    assert again["steps"] == 4 and f"{runs[1].name()}: training 4 steps" in caplog.text
    assert json.loads((second / RECORD_FILE).read_text())["result"] == again
    assert [p.name for _, p in list_checkpoints(second / "checkpoints")] == ["step_00000004"]


def snapshot(root: Path) -> dict:
    """Every path under root with its bytes and modification time: what 'nothing changed' compares."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(root.rglob("*"))}


def test_default_runs_are_the_registry_s_architectures_and_the_mossnet_pair():
    import argparse

    from linlm.experiments.cli import register
    from linlm.experiments.mqar import default_archs, default_runs
    from linlm.models.archs.base import MIXTURE
    from linlm.models.registry import ARCHITECTURES

    # Every registered architecture but the mixtures, in registry order; MossNet joins through experts.
    archs = default_archs()
    assert archs == [a for a, spec in ARCHITECTURES.items() if spec.family != MIXTURE]
    assert {"llama", "tnl", "hgrn2", "cosformer2", "mamba"} <= set(archs) and "mossnet" not in archs
    assert [r.name() for r in default_runs((16,), 2)] == [*(f"{a}-d16" for a in archs), "mossnet-E1-d16",
                                                          "mossnet-E2-d16"]
    defaults = register(argparse.ArgumentParser().add_subparsers()).parse_args(["--out", "x"])
    assert defaults.archs == ",".join(archs)  # `linlm mqar` trains the same set
    with pytest.raises(ConfigError, match="experts"):
        default_runs((16,), -1)
    # experts 1 is the one-expert MossNet once, 0 none.
    names = [r.name() for r in default_runs((16,), 1, ("tnl",))]
    assert names == ["tnl-d16", "mossnet-E1-d16"]
    assert [r.name() for r in default_runs((16,), 0, ("tnl",))] == ["tnl-d16"]


def test_a_stop_is_a_keyboard_interrupt_with_the_shell_code_of_its_signal():
    from linlm.signals import Stopped

    assert isinstance(Stopped("SIGINT", "x"), KeyboardInterrupt)
    assert [Stopped(name, "x").exit_code for name in ("SIGINT", "SIGTERM", "signal")] == [130, 143, 130]


# ---- linlm mqar -------------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
TINY = ["--archs", "tnl,hgrn2", "--widths", "16", "--experts", "0", "--vocab-size", "32", "--num-kv", "3",
        "--layers", "1", "--head-dim", "8", "--batch-size", "4", "--test-sequences", "64", "--threads", "1"]


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e["OMP_NUM_THREADS"] = "1"
    return e


def one_error(capsys, *expected: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("linlm: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(x in lines[0] for x in expected), lines[0]
    return lines[0]


@pytest.fixture
def torch_threads():
    """Training in this process sets torch's thread count (--threads 1); the tests after it get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_ctrl_c_stops_the_experiment_and_the_same_command_resumes_it(tmp_path, caplog, torch_threads):
    """One SIGINT to `linlm mqar` during its first run: that run is neither measured nor recorded, the second is
    not trained, the exit code is 130 and the message gives the command that continues. That command resumes the
    stopped run from its checkpoint to the row an uninterrupted run gives, then trains the rest; once more, it
    reads both back."""
    from linlm.train.metrics import read_metrics

    out, steps = tmp_path / "mqar", 100
    proc = subprocess.Popen([sys.executable, "-m", "linlm", "mqar", "--out", str(out), *TINY, "--steps",
                             str(steps)], env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not read_metrics(out / "tnl-d16" / "metrics.jsonl"):
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "--resume" not in err
    stopped = len(read_metrics(out / "tnl-d16" / "metrics.jsonl"))
    assert stopped < steps, "the run finished before the signal came; the test tested nothing"
    assert (out / "tnl-d16" / "checkpoints" / f"step_{stopped:08d}").is_dir()
    from linlm.experiments.mqar import RECORD_FILE, MQARRun, run_experiment

    assert json.loads((out / "tnl-d16" / RECORD_FILE).read_text())["result"] is None  # nothing recorded
    assert json.loads((out / "hgrn2-d16" / RECORD_FILE).read_text())["result"] is None
    assert sorted(p.name for p in (out / "hgrn2-d16").iterdir()) == sorted([".linlm-files.json", RECORD_FILE])
    assert not (out / "results.json").exists()  # nothing further trained, no table
    assert f"stopped by SIGINT: tnl-d16 at step {stopped} of {steps}" in err
    words = shlex.split(err.split("run the same command again: ")[1].strip())
    assert words[:2] == ["linlm", "mqar"]

    caplog.set_level(logging.INFO, logger="linlm")  # the log, whichever stream linlm's handler writes to
    assert main(words[1:]) == 0
    assert f"tnl-d16: resuming at step {stopped} of {steps}" in caplog.text
    rows = json.loads((out / "results.json").read_text())["runs"]
    assert [(r["name"], r["steps"]) for r in rows] == [("tnl-d16", steps), ("hgrn2-d16", steps)]
    # The resumed run ends where an uninterrupted one does (the same weights: the same loss and accuracy).
    [uninterrupted] = run_experiment([MQARRun("tnl", 16)], MQARConfig(vocab_size=32, num_kv=3), tmp_path / "ref",
                                     steps=steps, batch_size=4, lr=1e-2, n_layers=1, head_dim=8, test_sequences=64,
                                     threads=1)
    assert {**rows[0], "seconds": None} == {**uninterrupted, "seconds": None}

    # Once more: both results are read back, nothing in the run directories changes.
    before = snapshot(out / "tnl-d16")
    caplog.clear()
    assert main(words[1:]) == 0
    assert caplog.text.count("finished earlier") == 2
    assert snapshot(out / "tnl-d16") == before


def test_outputs_are_checked_before_any_training(tmp_path, capsys):
    """A user's results.json or mqar.png in --out, or a run directory of another experiment, refuses the
    command before anything is trained or written; the outputs written are linlm's (ledgered)."""
    from linlm import outputs

    for name in ("results.json", "mqar.png"):
        out = tmp_path / name.replace(".", "_")
        out.mkdir()
        (out / name).write_text("mine")
        assert main(["mqar", "--out", str(out), *TINY, "--steps", "2"]) == 2
        one_error(capsys, "--out", name)
        assert sorted(p.name for p in out.iterdir()) == [name] and (out / name).read_text() == "mine"

    out = tmp_path / "mqar"
    assert main(["mqar", "--out", str(out), "--archs", "hgrn2", *TINY[2:], "--steps", "2"]) == 0
    capsys.readouterr()
    assert outputs.owns_file(out / "results.json") and outputs.owns_file(out / "mqar.png")
    # tnl-d16 would be new, hgrn2-d16 is of another experiment (2 steps, not 3): refused before tnl trains.
    assert main(["mqar", "--out", str(out), *TINY, "--steps", "3"]) == 2
    one_error(capsys, "hgrn2-d16", "another experiment", "--overwrite")
    assert not (out / "tnl-d16").exists()


@pytest.mark.parametrize("flags, expected", [
    (["--threads", "0"], "--threads 0"), (["--num-queries", "0"], "--num-queries 0"),
    (["--head-dim", "0"], "--head-dim 0"), (["--test-sequences", "0"], "--test-sequences 0"),
    (["--experts", "-1"], "--experts -1"), (["--lr", "nan"], "--lr nan"), (["--widths", "12"], "head_dim 8"),
    (["--widths", "16,16"], "given twice"), (["--archs", ""], "no runs"),
])
def test_numbers_are_checked_and_zero_is_no_default(tmp_path, capsys, flags, expected):
    out = tmp_path / "mqar"
    assert main(["mqar", "--out", str(out), *TINY, "--steps", "2", *flags]) == 2
    one_error(capsys, expected)
    assert not out.exists()
