"""MQAR runs trained several at once (``jobs``), each in a worker process: the rows one by one gives, in the same
order; a stop checkpoints every running run and records none; the same command resumes them."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from linlm.eval.mqar import MQARConfig
from linlm.experiments.mqar import RECORD_FILE, MQARRun, Plateau, run_experiment

REPO = Path(__file__).resolve().parents[2]
CFG = MQARConfig(vocab_size=32, num_kv=3)
RUNS = [MQARRun("llama", 16, lr=5e-3), MQARRun("tnl", 16, lr=5e-3), MQARRun("hgrn2", 16, lr=5e-3)]


def same(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "seconds"}  # the one field that is time, not computation


def test_two_at_once_give_the_rows_of_one_by_one_in_order_and_read_back(tmp_path, torch_threads, monkeypatch):
    rule = Plateau(block=4, min_steps=8, max_steps=16, tolerance=1e-9, floor=0.0)
    kw = {"batch_size": 4, "head_dim": 8, "test_sequences": 32, "plateau": rule, "threads": 1}
    serial = run_experiment(RUNS, CFG, tmp_path / "one", **kw)
    fractions = []
    both = run_experiment(RUNS, CFG, tmp_path / "two", jobs=2, on_fraction=fractions.append, **kw)
    assert [r["run"] for r in both] == [r["run"] for r in serial] == ["llama-d16-s0", "tnl-d16-s0", "hgrn2-d16-s0"]
    assert [same(r) for r in both] == [same(json.loads(json.dumps(r))) for r in serial]  # bitwise: one thread each
    assert fractions[-1] == 1.0 and len(fractions) == 3
    for r in both:  # each worker recorded its run as the serial path does
        assert json.loads((tmp_path / "two" / r["run"] / RECORD_FILE).read_text())["result"] == r
    # Again: every run is read back, no worker starts.
    import linlm.train.workers as workers

    monkeypatch.setattr(workers, "run_pool", lambda *a, **k: pytest.fail("a worker started"))
    assert run_experiment(RUNS, CFG, tmp_path / "two", jobs=2, **kw) == both


def test_sigterm_stops_every_worker_records_nothing_and_the_command_resumes(tmp_path, torch_threads):
    """`linlm mqar --jobs 2` stopped by SIGTERM while its first two runs train: both checkpoint and stop, neither
    is recorded, the third never starts, the exit is 143 with the command that continues; that command ends with
    the rows an uninterrupted run gives."""
    from linlm.train.metrics import read_metrics

    out, steps = tmp_path / "mqar", 1000
    cmd = ["--out", str(out), "--archs", "tnl,hgrn2,llama", "--widths", "16", "--experts", "0", "--vocab-size", "32",
           "--num-kv", "3", "--layers", "1", "--head-dim", "8", "--batch-size", "4", "--test-sequences", "32",
           "--steps", str(steps), "--jobs", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.Popen([sys.executable, "-m", "linlm", "mqar", *cmd], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = [out / name / "metrics.jsonl" for name in ("tnl-d16-s0", "hgrn2-d16-s0")]
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not all(read_metrics(m) for m in first):
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "stopped by SIGTERM" in err
    for m in first:
        stopped = len(read_metrics(m))
        assert 0 < stopped < steps, "a run finished before the signal came; the test tested nothing"
        assert (m.parent / "checkpoints" / f"step_{stopped:08d}").is_dir()
        assert json.loads((m.parent / RECORD_FILE).read_text())["result"] is None
    assert not (out / "llama-d16-s0" / "metrics.jsonl").exists() and not (out / "results.json").exists()
    words = shlex.split(err.split("run the same command again: ")[1].strip())
    assert words[:2] == ["linlm", "mqar"] and "--jobs" in words
    from linlm.cli import main

    assert main(words[1:]) == 0
    rows = json.loads((out / "results.json").read_text())["runs"]
    for r in rows:  # each run's log reads as one run, step 1 to the end
        assert [x["step"] for x in read_metrics(out / r["run"] / "metrics.jsonl") if "loss" in x] == \
            list(range(1, steps + 1))
    ref = run_experiment([MQARRun("tnl", 16)], CFG, tmp_path / "ref", steps=steps, batch_size=4,
                         n_layers=1, head_dim=8, test_sequences=32, threads=1)
    assert same(rows[0]) == same(json.loads(json.dumps(ref[0])))
