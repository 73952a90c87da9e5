"""Two processes under torchrun (gloo, CPU) follow the loss curve of one process with the same global batch, for
DDP and FSDP2, and a 2-process checkpoint resumes in one process."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from train_helpers import cli_env, tiny_config_dict, write_yaml

from linlm.train.train_config import TrainConfig
from linlm.train import train
from linlm.train.metrics import read_metrics

STEPS = 6
# Same global batch, different summation order (two half-batches, all-reduced): float32 rounding only.
RTOL = 1e-6


def config(tiny_data, out, **top) -> dict:
    return tiny_config_dict(tiny_data, out, steps=STEPS, eval__every=3, checkpoint__every=3, checkpoint__keep=3,
                            batch_size=4, **top)


@pytest.fixture(scope="module")
def single(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "run"
    result = train(TrainConfig.from_dict(config(tiny_data, out)), verbose=False)
    return read_metrics(result.out_dir / "metrics.jsonl")


def losses(records):
    return [r["loss"] for r in records], [r["val_loss"] for r in records if "val_loss" in r]


@pytest.mark.parametrize("strategy, recompute", [("ddp", False), ("fsdp", False), ("fsdp", True)],
                         ids=["ddp", "fsdp", "fsdp-activation-checkpointing"])
def test_two_processes_match_one_and_resume_in_one(tiny_data, tmp_path, single, strategy, recompute):
    """With activation checkpointing, FSDP shards the wrapped blocks, and the one process resumes without it."""
    out = tmp_path / "run"
    cfg = config(tiny_data, out, distributed__strategy=strategy, activation_checkpointing=recompute)
    path = write_yaml(tmp_path / "cfg.yaml", cfg)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "linlm",
           "train", "--config", str(path), "--quiet"]
    r = subprocess.run(cmd, env=cli_env(), capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    two = read_metrics(out / "metrics.jsonl")
    assert [x["step"] for x in two] == list(range(1, STEPS + 1)), "rank 0 alone writes one line per step"
    (l1, v1), (l2, v2) = losses(single), losses(two)
    assert l2 == pytest.approx(l1, rel=RTOL)
    assert v2 == pytest.approx(v1, rel=RTOL)
    assert l2[-1] < l2[0]

    # resume the 2-process run from its step-3 checkpoint in one process
    shutil.rmtree(out / "checkpoints" / f"step_{STEPS:08d}")
    resumed = train(TrainConfig.from_dict({**cfg, "activation_checkpointing": False}), resume=True, verbose=False)
    assert resumed.step == STEPS
    three = read_metrics(out / "metrics.jsonl")
    assert [x["step"] for x in three] == list(range(1, STEPS + 1))
    l3, v3 = losses(three)
    assert l3[:3] == l2[:3], "the log up to the checkpoint is kept as written"
    assert l3[3:] == pytest.approx(l2[3:], rel=RTOL)
    assert v3 == pytest.approx(v2, rel=RTOL)
