"""Several runs of a grid at once (``jobs``): same results as one by one, stop and resume, failures reported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from linlm import outputs
from linlm.errors import CheckpointError, ConfigError
from linlm.scaling.ladder import load_ladder, plan_runs
from linlm.scaling.progress import wall_seconds
from linlm.scaling.runner import run_grid
from linlm.train.workers import WorkerError


def tiny_ladder(path: Path, tokens: int = 4096, jobs: int = 1, tokens_b: int = 4096) -> Path:
    data = {"name": "tiny", "archs": ["llama", "tnl"], "jobs": jobs,
            "train": {"data": {"source": "shakespeare", "tokenizer": "bpe:300", "seq_len": 32, "val_fraction": 0.1},
                      "optim": {"lr": 1.0e-2}, "batch_size": 4, "threads": 1, "eval": {"every": 0},
                      "checkpoint": {"every": 8, "keep": 1}, "peak_flops": 1.0e11,
                      "samples": {"prompts": [], "max_new_tokens": 0}, "log_every": 1},
            "rungs": [{"name": "a", "model": {"n_layers": 1, "d_model": 16, "n_heads": 1}, "tokens": tokens},
                      {"name": "b", "model": {"n_layers": 1, "d_model": 32, "n_heads": 2}, "tokens": tokens_b}]}
    path.write_text(yaml.safe_dump(data))
    return path


def losses(out: Path) -> dict:
    found = {}
    for run in sorted(p for p in (out / "runs").iterdir() if p.is_dir()):
        recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        found[run.name] = [(r["step"], r["loss"]) for r in recs if "loss" in r]
    return found


def test_two_at_once_trains_what_one_by_one_trains(tmp_path, text_file):
    ladder = load_ladder(str(tiny_ladder(tmp_path / "tiny.yaml")))
    over = {"data": {"source": str(text_file)}}
    lines = []
    serial = run_grid(ladder, None, tmp_path / "one", overrides=over, say=lambda s: None)
    both = run_grid(ladder, None, tmp_path / "two", overrides=over, say=lines.append, jobs=2)
    assert sorted(serial["trained"]) == sorted(both["trained"]) == ["llama-a", "llama-b", "tnl-a", "tnl-b"]
    assert any("2 runs at a time" in s for s in lines)
    assert losses(tmp_path / "two") == losses(tmp_path / "one")  # bitwise: same seeds, one thread each
    # A second invocation finds everything finished and starts no worker.
    again = run_grid(ladder, None, tmp_path / "two", overrides=over, say=lambda s: None, jobs=2)
    assert again["trained"] == [] and len(again["done"]) == 4


def test_sigterm_stops_every_worker_with_a_checkpoint_and_the_rerun_resumes(tmp_path, text_file):
    # The first rung is long enough to be interrupted; the second, which only the rerun trains, is short.
    path = tiny_ladder(tmp_path / "tiny.yaml", tokens=150_000, tokens_b=4096)
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "linlm", "scaling", "run", "--ladder", str(path), "--out", str(out),
           "--set", f"data.source={text_file}", "--jobs", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = [out / "runs" / name / "metrics.jsonl" for name in ("llama-a", "tnl-a")]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(m.is_file() and m.stat().st_size > 2000 for m in metrics):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, text
    assert "run the same command again to resume" in text
    for name in ("llama-a", "tnl-a"):  # both workers wrote a checkpoint and stopped short of the end
        run = out / "runs" / name
        assert list((run / "checkpoints").glob("step_*")), text
        assert not json.loads((run / "summary.json").read_text())["finished"]
    assert not (out / "runs" / "llama-b").exists()  # nothing new started after the signal
    # The rerun resumes: each run's log reads as one run, step 1 to the end.
    ladder = load_ladder(str(path))
    res = run_grid(ladder, None, out, overrides={"data": {"source": str(text_file)}}, say=lambda s: None, jobs=2)
    assert sorted(res["trained"]) == ["llama-a", "llama-b", "tnl-a", "tnl-b"]
    for name, recs in losses(out).items():
        assert [s for s, _ in recs] == list(range(1, len(recs) + 1)), name


def test_a_failing_worker_raises_its_error_and_a_killed_one_is_named(tmp_path, text_file):
    ladder = load_ladder(str(tiny_ladder(tmp_path / "tiny.yaml")))
    over = {"data": {"source": str(text_file)}}
    out = tmp_path / "sweep"
    outputs.write_json(out / "plan.json", {"ladder": ladder.name, "archs": ladder.archs, "runs": []})
    outputs.make_dir(out / "runs" / "tnl-a")  # a run of this sweep whose one checkpoint is damaged
    bad = out / "runs" / "tnl-a" / "checkpoints" / "step_00000004"
    outputs.write_bytes(bad / "model.pt", b"not a checkpoint")  # a broken checkpoint of linlm's, not a user's
    with pytest.raises(CheckpointError):
        run_grid(ladder, None, out, overrides=over, say=lambda s: None, jobs=2)

    from linlm.train import workers

    if not Path("/proc/self").is_dir():
        pytest.skip("finding the worker processes to kill reads /proc")

    def kill_workers(key, loss):
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                cmd = (stat.parent / "cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and b"linlm.train.workers" in cmd:
                os.kill(int(stat.parent.name), signal.SIGKILL)

    jobs = [(r.name, r.config) for r in plan_runs(ladder, ["llama"], tmp_path / "killed", over)]
    with pytest.raises(WorkerError, match=r"llama-[ab]: its worker process exited with code -9 before finishing; "
                                          r"run the same command again to resume it"):
        workers.run_pool(jobs, 2, on_start=lambda k: None, on_step=kill_workers, on_done=lambda k, r: None)


def test_jobs_must_be_positive_and_the_plan_counts_them(tmp_path, capsys):
    from linlm.cli import main

    data = yaml.safe_load(tiny_ladder(tmp_path / "t.yaml").read_text())
    data["jobs"] = 0
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="jobs: expected a whole number of runs to train at once"):
        load_ladder(str(tmp_path / "bad.yaml"))
    assert main(["scaling", "run", "--ladder", "smoke", "--out", str(tmp_path / "o"), "--jobs", "0"]) == 2
    assert "--jobs: expected a whole number from 1 to 4096, got '0'" in capsys.readouterr().err
    assert wall_seconds([10, 10, 10, 10], 2) == 20 and wall_seconds([30, 10, 10, 10], 2) == 30
    assert wall_seconds([5, 7], 1) == 12 and wall_seconds([], 3) == 0


def test_time_left_follows_the_seconds_per_step_of_finished_runs():
    from types import SimpleNamespace

    from linlm.scaling.ladder import PlannedRun
    from linlm.scaling.progress import GridProgress, fit_step_time

    # seconds per step = 0.02 + 1e-10 x FLOPs per step, recovered exactly; one size only: a pure rate.
    assert fit_step_time([(1e8, 0.03), (1e9, 0.12), (5e8, 0.07)]) == pytest.approx((0.02, 1e-10))
    assert fit_step_time([(1e9, 0.5)]) == pytest.approx((0.0, 5e-10))
    assert fit_step_time([(1e9, 0.5), (1.2e9, 0.4)]) == pytest.approx((0.0, 0.9 / 2.2e9))  # too close to fit a line
    assert fit_step_time([(1e8, 0.2), (1e9, 0.1)]) == pytest.approx((0.15, 0.0))  # noise: no negative slope

    def run(name, steps, flops_per_token):
        return PlannedRun(name=name, arch="x", rung=name, config=SimpleNamespace(steps=steps), tokens=steps * 100,
                          tokens_per_step=100, params=1, paper_flops_per_token=flops_per_token,
                          head_flops_per_token=0.0)

    todo = [run("a", 10, 1e6), run("b", 10, 1e7), run("c", 100, 1e7), run("d", 100, 1e6)]
    p = GridProgress(todo, live=False, say=lambda s: None, jobs=2)
    assert p.eta() is None
    for name, secs in (("a", 10 * (0.02 + 1e-10 * 1e8)), ("b", 10 * (0.02 + 1e-10 * 1e9))):
        for _ in range(10):
            p.step(name, "")
        p.finished(name, secs)
    # c: 100 x 0.12 s = 12 s and d: 100 x 0.03 s = 3 s, side by side on two workers: 12 s.
    assert p.eta() == pytest.approx(12.0)
    p.step("c", "")
    assert p.eta() == pytest.approx(99 * 0.12)
