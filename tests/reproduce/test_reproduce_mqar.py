"""linlm reproduce's MQAR section under a real Ctrl-C: the stopped run is never saved as a result, the stop goes up
to the job (exit 130), and the next run of the section resumes the stopped run from its checkpoint."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from output_asserts import assert_png

from linlm.reproduce.job import Job
from linlm.reproduce.recipes import load_recipe

REPO = Path(__file__).resolve().parents[2]
STEPS = 100
SETTINGS = {"task": {"vocab_size": 32, "num_kv": 3}, "widths": [16], "experts": [], "archs": ["llama", "tnl"],
            "steps": STEPS, "batch_size": 4, "lr": 3e-3, "n_layers": 1, "head_dim": 8, "test_sequences": 64}
# The job's section in a process of its own, stopped as `linlm reproduce` stops (KeyboardInterrupt: exit 130).
SCRIPT = """
import json, sys
from pathlib import Path
from linlm.reproduce.job import Job
from linlm.reproduce.recipes import load_recipe
from linlm.train.cli import setup_logging

setup_logging()
job = Job(load_recipe("smoke").with_settings(mqar=json.loads(sys.argv[2])), Path(sys.argv[1]))
try:
    job.run_section("mqar", lambda fraction: None)
except KeyboardInterrupt as e:
    print(f"interrupted: {e}", file=sys.stderr)
    sys.exit(130)
"""


def recorded_rows(root: Path) -> dict[str, dict]:
    """Every MQAR result row stored as JSON anywhere under root, by run name, whatever the layout."""
    rows = {}
    for path in root.rglob("*.json"):
        data = json.loads(path.read_text())
        for row in (data, data.get("result")) if isinstance(data, dict) else ():
            if isinstance(row, dict) and "accuracy" in row and "name" in row:
                rows[row["name"]] = row
    return rows


def test_ctrl_c_in_the_mqar_section_saves_nothing_and_the_rerun_resumes(tmp_path, caplog):
    from linlm.train.metrics import read_metrics

    out = tmp_path / "job"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(out), json.dumps(SETTINGS)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = out / "mqar" / "llama-d16-s0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not read_metrics(metrics):
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    stopped = len(read_metrics(metrics))
    assert stopped < STEPS, "the run finished before the signal came; the test tested nothing"
    assert f"interrupted: stopped by SIGINT: llama-d16-s0 at step {stopped} of {STEPS}" in err
    assert recorded_rows(out) == {}  # the stopped run is saved nowhere, and no later run was trained
    assert not (out / "mqar" / "tnl-d16-s0" / "config.yaml").exists() and not (out / "plots" / "mqar.png").exists()

    # The job runs the section again (here, in this process): the stopped run resumes from its checkpoint.
    job = Job(load_recipe("smoke").with_settings(mqar=SETTINGS), out)
    threads = torch.get_num_threads()
    caplog.set_level(logging.INFO, logger="linlm")
    try:
        result = job.run_section("mqar", lambda fraction: None)
    finally:
        torch.set_num_threads(threads)
    assert f"llama-d16-s0: resuming at step {stopped} of {STEPS}" in caplog.text
    assert [(r["name"], r["steps"]) for r in result["rows"]] == [("llama-d16", STEPS), ("tnl-d16", STEPS)]
    first = read_metrics(metrics)
    assert [r["step"] for r in first] == list(range(1, STEPS + 1))
    assert sorted(p.name for p in (out / "mqar" / "llama-d16-s0" / "checkpoints").iterdir()
                  if p.name.startswith("step_")) == [f"step_{STEPS:08d}"]
    assert recorded_rows(out) == {r["name"]: r for r in result["runs"]}  # one seed: a run per configuration
    assert [(c["name"], c["seeds"], c["accuracy"]) for c in result["rows"]] == [
        (r["name"], [0], r["accuracy"]) for r in result["runs"]]
    assert_png(out / "plots" / "mqar.png", (1200, 480))  # 10 x 4 inches at 120 dpi, drawn


def test_the_section_refuses_a_seed_count_below_one_before_training(tmp_path):
    import pytest

    from linlm.errors import ConfigError
    smoke = load_recipe("smoke")
    for seeds in (0, -1, "3"):  # refused as the recipe is read, before any job exists
        with pytest.raises(ConfigError, match=r"recipe smoke: mqar\.?:? ?seeds"):
            smoke.with_settings(mqar={**SETTINGS, "seeds": seeds})
    m = smoke.with_settings(mqar={**SETTINGS, "experts": [1, 2], "policies": ["routed-k1"], "seeds": 2,
                                  "seed": 5}).mqar
    assert m.seed_list == [5, 6]
    assert [r.name() for r in m.configs()][:5] == ["llama-d16", "tnl-d16", "mossnet-E1-d16",
                                                   "mossnet-E2-routed-k1-d16", "llama-eqparams-d16"]
