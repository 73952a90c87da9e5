"""The time estimate of a plan from a FLOP rate: each run costed by its counted FLOPs, the LM head included."""

from __future__ import annotations

import pytest

from linlm.models.counting import count
from linlm.scaling.data import vocab_guess
from linlm.scaling.estimate import estimate
from linlm.scaling.ladder import load_ladder, plan_runs
from linlm.scaling.plan import plan_rows


def test_a_flop_rate_costs_each_run_by_its_counted_flops_with_the_head(tmp_path):
    ladder = load_ladder("smoke")
    runs = plan_runs(ladder, ["llama", "tnl"], tmp_path / "sweep")
    rows = plan_rows(ladder, runs, say=lambda text: None, prepare=False)
    rows[0].status = "done"
    estimate(rows, 1e9, measure=True, say=pytest.fail)  # a rate given: nothing is timed
    assert rows[0].seconds == 0.0
    for row in rows[1:]:
        r = row.run
        c = count(r.config.model_config(vocab_size=vocab_guess(r.config, row.data)), batch=r.config.batch_size,
                  seq_len=r.config.data.seq_len)
        assert row.seconds == pytest.approx(
            r.tokens * (c["counted_flops_per_token"] + c["lm_head_flops_per_token"]) / 1e9, rel=1e-12)
        # Not the paper figure the plan's compute is in (nor its stand-in vocabulary's head).
        assert row.seconds != pytest.approx(r.training_flops / 1e9, rel=1e-6)
