"""A run killed at random moments (kill -9, SIGTERM, SIGINT) resumes to bitwise the same final weights and the
same loss curve as the uninterrupted run. Each run is a real `python -m linlm train` subprocess."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import assert_bitwise_equal, cli_env, final_weights, run_cli, tiny_config_dict, write_yaml

from linlm.train.metrics import read_metrics

STEPS = 60


def config_file(tiny_data: Path, root: Path, name: str) -> Path:
    cfg = tiny_config_dict(tiny_data, root / name, steps=STEPS, eval__every=10, checkpoint__every=3,
                           checkpoint__keep=2, log_every=10)
    return write_yaml(root / f"{name}.yaml", cfg)


@pytest.fixture(scope="module")
def reference(tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("kill")
    path = config_file(tiny_data, root, "ref")
    r = run_cli(["train", "--config", str(path), "--quiet"], timeout=300)
    assert r.returncode == 0, r.stderr
    records = read_metrics(root / "ref" / "metrics.jsonl")
    return root, final_weights(root / "ref"), records


def start(path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "linlm", "train", "--config", str(path), "--quiet"],
                            env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for_steps(metrics: Path, n: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if len(read_metrics(metrics)) >= n:
            return
        time.sleep(0.01)


def check_same_as_reference(run_dir: Path, reference) -> None:
    _, weights, records = reference
    assert_bitwise_equal(weights, final_weights(run_dir))
    got = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert [(r["loss"], r.get("val_loss")) for r in got] == [(r["loss"], r.get("val_loss")) for r in records]


def test_kill_9_at_random_moments_then_resume(tiny_data, reference):
    root, _, records = reference
    step_seconds = records[-1]["time"] / STEPS
    rng = random.Random(20240611)
    killed_mid_run = 0
    for trial in range(3):
        path = config_file(tiny_data, root, f"kill{trial}")
        out = root / f"kill{trial}"
        proc = start(path)
        # a random step, then a random moment within the next step or so: mid-step, mid-checkpoint, mid-log
        wait_for_steps(out / "metrics.jsonl", rng.randint(1, STEPS - 10), proc)
        time.sleep(rng.uniform(0.0, 1.5 * step_seconds))
        if proc.poll() is None:
            proc.kill()
            killed_mid_run += 1
        proc.wait(timeout=60)
        r = run_cli(["train", "--config", str(path), "--resume", "--quiet"], timeout=300)
        assert r.returncode == 0, r.stderr
        check_same_as_reference(out, reference)
    assert killed_mid_run >= 2, "the runs finished before they could be killed; the test did not test anything"


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_writes_a_checkpoint_then_resume(tiny_data, request, tmp_path, sig, code):
    # SIGINT only checks the checkpoint (resuming is tested after SIGTERM), so it needs no reference run
    reference = request.getfixturevalue("reference") if sig == signal.SIGTERM else None
    root = tmp_path
    name = f"sig{int(sig)}"
    path = config_file(tiny_data, root, name)
    out = root / name
    proc = start(path)
    wait_for_steps(out / "metrics.jsonl", 5, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    last = read_metrics(out / "metrics.jsonl")[-1]["step"]
    assert last < STEPS
    assert (out / "checkpoints" / f"step_{last:08d}" / "manifest.json").is_file(), \
        "the signal must leave a checkpoint of the last finished step"
    if sig == signal.SIGINT:
        return  # resuming is the same as after SIGTERM (below); one subprocess less
    r = run_cli(["train", "--config", str(path), "--resume", "--quiet"], timeout=300)
    assert r.returncode == 0, r.stderr
    check_same_as_reference(out, reference)
