"""MQAR runs trained to a plateau by a stated rule (and stopped, resumed, to the same steps), each configuration at
the learning rate its sweep chose, and the one-expert MossNet widened to the paper's MossNet's active size."""

from __future__ import annotations

import json
import math

import pytest

from linlm.errors import ConfigError
from linlm.eval.mqar import MQARConfig
from linlm.experiments.mqar import RECORD_FILE, MQARRun, run_experiment, sweep_learning_rates
from linlm.experiments.mqar_plateau import Plateau, at_chance, choose_lr, copying, learning_loss, recent_loss


def records(losses: list[float], every: int = 10) -> list[dict]:
    return [{"step": every * (i + 1), "loss": x} for i, x in enumerate(losses)]


def test_the_plateau_rule_compares_the_last_block_with_the_one_before():
    rule = Plateau(block=100, min_steps=200, max_steps=600, tolerance=0.02, floor=0.01)
    falling = records([3.0] * 10 + [2.5] * 10)  # step 200: the last block fell by 17 %
    flat = records([2.0] * 10 + [1.99] * 10)  # 0.5 %
    assert rule.plateaued(falling) is False and rule.plateaued(flat) is True
    near_zero = records([0.02] * 10 + [0.012] * 10)  # 40 % of itself, but under the 0.01-nat floor
    assert rule.plateaued(near_zero) is True
    assert rule.plateaued(records([3.0] * 15)) is None  # step 150: no block boundary
    assert rule.plateaued(records([3.0] * 10)) is None  # step 100: below min_steps
    # Continued from any step, a run goes to the same block boundaries, never past max_steps.
    assert [rule.next_steps(s) for s in (200, 250, 300, 550)] == [300, 300, 400, 600]
    for bad in ({"block": 100, "min_steps": 150}, {"min_steps": 400, "max_steps": 300}, {"tolerance": 0.0}):
        with pytest.raises(ConfigError, match="plateau"):
            Plateau(**{"block": 100, "min_steps": 200, **bad}).validate()
    assert "within 2%" in rule.text()


def test_a_loss_flat_at_chance_is_not_a_plateau_and_a_run_may_stop_there():
    """MQAR's loss sits flat at chance's (ln 64 for 64 values) before it falls: flat there is not a plateau; flat
    0.1 nats or more below it is. With chance_steps a run still at chance stops there."""
    chance, flat_loss = 1 / 64, math.log(64)
    rule = Plateau(block=100, min_steps=200, max_steps=600, chance_margin=0.1, chance_steps=400).validate()
    at = records([flat_loss + 0.004] * 20)
    assert Plateau(block=100, min_steps=200).plateaued(at) is True  # without the task's chance: the old rule
    assert rule.plateaued(at, chance) is False and rule.gives_up(at, chance) is False  # step 200 < chance_steps
    assert rule.plateaued(records([flat_loss - 0.05] * 20), chance) is False  # 0.05 nats: not yet learning
    assert rule.plateaued(records([flat_loss - 0.2] * 20), chance) is True
    assert rule.gives_up(records([flat_loss] * 40), chance) is True  # step 400, still at chance
    assert rule.gives_up(records([flat_loss - 0.3] * 40), chance) is False
    # The recent loss is the last tenth of the steps: a run that has just left chance has left it.
    assert at_chance(recent_loss([flat_loss] * 90 + [flat_loss - 0.5] * 10), chance) is False
    assert at_chance(None, chance) is True and "0.1 nats" in rule.text() and "400 steps" in rule.text()
    # The held-out loss (the task's pairs alone) decides when the last step measured one: a stream that mixes in
    # fewer pairs can fall below chance on those while the task itself sits at chance.
    mixed = records([flat_loss - 0.2] * 20)
    assert rule.plateaued(mixed, chance) is True
    mixed[-1]["val_loss"] = flat_loss - 0.01
    assert rule.plateaued(mixed, chance) is False and learning_loss(mixed) == flat_loss - 0.01
    mixed[-1]["val_loss"] = flat_loss - 0.3
    assert rule.plateaued(mixed, chance) is True
    for bad in ({"chance_steps": 250}, {"chance_steps": 700}, {"chance_margin": -0.1}):
        with pytest.raises(ConfigError, match="chance"):
            Plateau(**{"block": 100, "min_steps": 200, "max_steps": 600, **bad}).validate()


def test_a_loss_flat_at_copying_a_context_value_is_not_a_plateau():
    """After chance the loss sits near the level of copying a value of the context in proportion to its count: flat
    there is not a plateau (the run trains on, and never gives up there); flat 0.1 nats or more below it is."""
    chance, copy_loss = 1 / 64, MQARConfig(vocab_size=128, num_kv=16).copy_loss
    rule = Plateau(block=100, min_steps=200, max_steps=600, chance_margin=0.1, chance_steps=400).validate()
    flat = records([copy_loss] * 40)
    assert rule.plateaued(flat, chance) is True  # without the copy level: the rule that stopped such runs
    assert rule.plateaued(flat, chance, copy_loss) is False and rule.gives_up(flat, chance) is False
    assert rule.plateaued(records([copy_loss - 0.05] * 40), chance, copy_loss) is False
    assert rule.plateaued(records([copy_loss - 0.2] * 40), chance, copy_loss) is True
    assert copying(copy_loss, copy_loss) and not copying(copy_loss - 0.2, copy_loss) and copying(None, copy_loss)
    assert "copying" in rule.text()


def test_a_run_still_at_chance_stops_at_chance_steps_and_says_so(tmp_path):
    cfg = MQARConfig(vocab_size=32, num_kv=3)  # 16 values: chance's loss ln 16; 8 steps of llama stay above it
    rule = Plateau(block=4, min_steps=8, max_steps=16, chance_steps=8)
    [row] = run_experiment([MQARRun("llama", 16, lr=1e-4)], cfg, tmp_path, batch_size=4, head_dim=8,
                           test_sequences=32, plateau=rule)
    assert row["loss_last_window"] > math.log(16) - 0.1
    assert row["steps"] == 8 and row["plateaued"] is False and row["at_chance"] is True and row["copying"] is False


def test_the_lowest_last_window_loss_chooses_the_learning_rate_and_a_diverged_run_loses():
    rows = [{"lr": 1e-3, "loss_last_window": 2.0}, {"lr": 3e-3, "loss_last_window": 1.5},
            {"lr": 1e-2, "loss_last_window": 0.1, "diverged": "stopped at step 5"}]
    assert choose_lr(rows) == {"losses": {"0.001": 2.0, "0.003": 1.5, "0.01": None}, "chosen": 3e-3}


def test_a_run_trains_to_its_plateau_in_blocks_and_a_stopped_one_resumes_to_the_same_steps(tmp_path, monkeypatch):
    """A run that keeps falling trains to max_steps and says it did not plateau; stopped after its first block
    and run again, it continues block by block to the same end, with the same row."""
    cfg = MQARConfig(vocab_size=32, num_kv=3)
    rule = Plateau(block=4, min_steps=8, max_steps=16, tolerance=1e-9, floor=0.0)
    kw = {"batch_size": 4, "head_dim": 8, "test_sequences": 32, "plateau": rule}
    run = MQARRun("llama", 16, lr=5e-3)
    [row] = run_experiment([run], cfg, tmp_path / "a", **kw)
    from linlm.train.metrics import read_metrics

    metrics = read_metrics(tmp_path / "a" / run.dir_name() / "metrics.jsonl")
    assert row["steps"] in (8, 12, 16) and row["lr"] == 5e-3 and [r["step"] for r in metrics][-1] == row["steps"]
    assert row["plateaued"] is rule.plateaued(metrics, cfg.chance, cfg.copy_loss) and (row["plateaued"] or row["steps"] == 16)
    record = json.loads((tmp_path / "a" / run.dir_name() / RECORD_FILE).read_text())
    assert record["settings"]["plateau"]["max_steps"] == 16 and record["settings"]["train"]["schedule"]["kind"] == \
        "constant"
    # Stopped after 8 steps (the first block pair): the record holds no result; the rerun continues.
    import linlm.experiments.mqar_plateau as mp

    real = mp.Plateau.plateaued
    calls = []

    def stop_once(self, recs, chance=None, copy_loss=None):
        calls.append(recs[-1]["step"])
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(self, recs, chance, copy_loss)

    monkeypatch.setattr(mp.Plateau, "plateaued", stop_once)
    with pytest.raises(KeyboardInterrupt):
        run_experiment([run], cfg, tmp_path / "b", **kw)
    assert json.loads((tmp_path / "b" / run.dir_name() / RECORD_FILE).read_text())["result"] is None
    [again] = run_experiment([run], cfg, tmp_path / "b", **kw)
    keep = ("steps", "plateaued", "accuracy", "final_loss", "lr")
    assert {k: again[k] for k in keep} == {k: row[k] for k in keep}


def test_each_configuration_gets_the_learning_rate_its_sweep_chose(tmp_path):
    cfg = MQARConfig(vocab_size=32, num_kv=3)
    configs = [MQARRun("llama", 16), MQARRun("tnl", 16)]
    chosen = sweep_learning_rates(configs, [1e-4, 1e-2], cfg, tmp_path, steps=8, batch_size=4, head_dim=8,
                                  test_sequences=32)
    assert set(chosen) == {"llama-d16", "tnl-d16"}
    for table in chosen.values():
        assert set(table["losses"]) == {"0.0001", "0.01"} and table["chosen"] in (1e-4, 1e-2)
        best = min(table["losses"], key=lambda k: table["losses"][k])
        assert f"{table['chosen']:g}" == best
    assert (tmp_path / "llama-d16-lr0.01-s0" / RECORD_FILE).is_file()


def test_one_expert_widened_to_the_paper_mossnet_s_active_parameters():
    from linlm.experiments.mqar_grid import active_params, default_runs

    shape = {"n_layers": 2, "head_dim": 16, "vocab_size": 128, "seq_len": 64}
    runs = default_runs((64,), [4], ["llama"], ["routed-k2"], matched=False, equal_state=["mamba"],
                        wide_to="E4-routed-k2", **shape)
    names = [r.name() for r in runs]
    assert names == ["llama-d64", "mossnet-E4-routed-k2-d64", "mossnet-E1-wide-d64", "mamba-N64-d64"]
    heads, wide = active_params(runs[1], shape), active_params(runs[2], shape)
    assert abs(wide / heads - 1) < 0.02 and runs[2].overrides["ssm_experts"] == 1
    with pytest.raises(ConfigError, match="equal_state"):
        default_runs((64,), [4], ["llama"], ["routed-k2"], matched=False, equal_state=["llama"], **shape)
