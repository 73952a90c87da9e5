"""The divergence guard: exploded weights are caught, "last good" means a sane loss, and the advice works."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import pytest
from train_helpers import run_cli

import linlm.errors
import linlm.train
from linlm.train import TrainingDiverged, train
from linlm.train import checkpoint as ckpt
from linlm.train.metrics import read_metrics


def command_in(message: str) -> list[str]:
    """The `linlm train ...` command a divergence message gives, as argv after `linlm`."""
    assert "run: linlm train " in message, message
    argv = shlex.split(message.split("run: ", 1)[1])
    assert argv[:2] == ["linlm", "train"]
    return argv[1:]


def follow(message: str) -> Path:
    """Run the advised command word for word; return the new run's out_dir."""
    argv = command_in(message)
    done = run_cli(argv + ["--quiet"], timeout=600)
    assert done.returncode == 0, done.stderr
    out = Path(argv[argv.index("--out-dir") + 1]) if "--out-dir" in argv else None
    return out


def test_training_diverged_lives_in_errors_and_is_exported_by_train():
    assert linlm.train.TrainingDiverged is linlm.errors.TrainingDiverged


def test_exploded_weights_stop_at_once_and_the_start_over_advice_works(make_config):
    """lr=1e3 and no clipping: AdamW moves every weight by about 1e3 in one step; the loss can stay finite."""
    cfg = make_config("run", steps=8, optim__lr=1e3, optim__grad_clip=0.0, schedule__warmup_steps=0,
                      schedule__kind="constant")
    with pytest.raises(TrainingDiverged) as e:
        train(cfg, verbose=False)
    message = str(e.value)
    assert "stopped at step 1" in message and "weights" in message and "no good checkpoint" in message
    assert not ckpt.list_checkpoints(Path(cfg.out_dir) / "checkpoints")  # the exploded weights were never saved
    assert "--overwrite" in command_in(message) and "optim.grad_clip=1.0" in message
    follow(message)
    recs = read_metrics(Path(cfg.out_dir) / "metrics.jsonl")
    assert len(recs) == 8 and all(math.isfinite(r["loss"]) for r in recs)
    assert recs[-1]["loss"] < recs[0]["loss"]


def test_the_last_good_checkpoint_had_a_sane_loss_and_init_from_continues_it(make_config, monkeypatch):
    """A spike at step 5 (after good checkpoints at 2 and 4): the message names step 4, and following its command
    word for word trains a new run from those weights with the lower learning rate."""
    import linlm.train.trainer as trainer

    real = trainer.lr_at
    monkeypatch.setattr(trainer, "lr_at", lambda step, *a: 1e3 if step >= 4 else real(step, *a))
    cfg = make_config("run", steps=8, optim__grad_clip=0.0)
    with pytest.raises(TrainingDiverged) as e:
        train(cfg, verbose=False)
    message = str(e.value)
    good = Path(cfg.out_dir) / "checkpoints" / "step_00000004"
    assert "stopped at step 5" in message and f"the last good checkpoint is {good}" in message
    state = ckpt.read_state(good)
    assert state["sane"] and math.isfinite(state["loss"])
    assert [p.name for _, p in ckpt.list_checkpoints(good.parent)] == ["step_00000002", "step_00000004"]
    monkeypatch.undo()
    argv = command_in(message)
    assert argv[argv.index("--init-from") + 1] == str(good)
    new_out = follow(message)
    recs = read_metrics(new_out / "metrics.jsonl")
    assert len(recs) == 8 and all(math.isfinite(r["loss"]) for r in recs)
    # it started from the good weights: its first loss is near the old run's loss at step 4, far below ln(vocab)
    assert recs[0]["loss"] < state["loss"] + 0.5
    import yaml

    saved = yaml.safe_load((new_out / "config.yaml").read_text())
    assert saved["init_from"] == str(good) and saved["optim"]["lr"] == pytest.approx(3e-4)  # lr/10, at most the default
    assert saved["optim"]["grad_clip"] == 1.0


def test_a_zero_gradient_with_a_finite_loss_counts_as_a_bad_step():
    from linlm.train.guard import bad_step, exploded

    assert bad_step(5.0, 0.0) == "zero gradient"
    assert bad_step(float("nan"), 1.0) and bad_step(5.0, float("inf"))
    assert bad_step(5.0, 0.3) is None
    assert exploded(10.0, 1e11) and exploded(10.0, float("nan"))
    assert exploded(10.0, 12.0) is None


def test_init_from_refuses_another_model_shape(make_config, tmp_path):
    first = train(make_config("a", steps=2), verbose=False)
    wider = make_config("b", steps=2, init_from=str(first.out_dir), model__overrides={
        "n_layers": 2, "d_model": 64, "n_heads": 2, "glu_dim": 64, "max_seq_len": 128})
    with pytest.raises(linlm.errors.CheckpointError, match="d_model"):
        train(wider, verbose=False)
    assert not Path(wider.out_dir).exists()
