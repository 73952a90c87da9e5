"""The cost model: paper and counted FLOPs per token are different numbers with different names, the stand-in
vocabulary of a planned run, and the one formula for the FLOPs training spends."""

from __future__ import annotations

import pytest

from linlm.models.cost import STAND_IN_VOCAB, PlanCost, paper_flops_per_token, plan_cost, training_flops
from linlm.models.counting import count
from linlm.models.presets import preset_config


def _config(arch, preset, **over):
    return lambda vocab_size=None: preset_config(arch, preset, **{"vocab_size": vocab_size, **over})


@pytest.mark.parametrize("arch, pflops", [("llama", 1.6), ("tnl", 0.5), ("hgrn2", 0.5), ("cosformer2", 0.5)])
def test_paper_flops_of_a_preset_are_the_papers_and_not_the_counted(arch, pflops):
    counts = count(preset_config(arch, "paper-70m", vocab_size=STAND_IN_VOCAB), batch=480, seq_len=8192)
    cost = plan_cost(_config(arch, "paper-70m"), 480, 8192)
    # What the ladder and the sweep reader computed before the names were split: FLOPs per step over its tokens.
    assert cost.paper_flops_per_token == counts["flops_per_step"] / (480 * 8192) == paper_flops_per_token(counts)
    assert round(cost.paper_flops_per_token * 480 * 8192 / 1e15, 1) == pflops  # the PFLOPs the paper prints
    assert cost.params == counts["active_non_embedding_params"]
    assert cost.head_flops_per_token == counts["lm_head_flops_per_token"] == 3 * 2 * 512 * STAND_IN_VOCAB
    # The counted figure is another number: the layer shapes, not the paper's closed form.
    assert counts["counted_flops_per_token"] > 0
    assert abs(counts["counted_flops_per_token"] - cost.paper_flops_per_token) / cost.paper_flops_per_token > 1e-3


def test_an_architecture_without_a_paper_formula_falls_back_to_the_counted_flops():
    counts = count(preset_config("mamba", "tiny", vocab_size=STAND_IN_VOCAB), batch=2, seq_len=64)
    assert counts["flops_per_step_source"] == "counted from layer shapes"
    assert paper_flops_per_token(counts) == pytest.approx(counts["counted_flops_per_token"], rel=1e-12)
    assert plan_cost(_config("mamba", "tiny"), 2, 64).paper_flops_per_token == paper_flops_per_token(counts)


def test_the_stand_in_vocabulary_fills_in_only_a_missing_one():
    stand_in = plan_cost(_config("tnl", "tiny"), 2, 64)
    own = plan_cost(_config("tnl", "tiny", vocab_size=1024), 2, 64)  # a config that sets its own vocabulary
    assert isinstance(stand_in, PlanCost)
    assert (own.params, own.paper_flops_per_token) == (stand_in.params, stand_in.paper_flops_per_token)
    d_model = preset_config("tnl", "tiny").d_model
    assert stand_in.head_flops_per_token == 6 * d_model * STAND_IN_VOCAB
    assert own.head_flops_per_token == 6 * d_model * 1024
    assert plan_cost(_config("tnl", "tiny"), 2, 64) is stand_in  # counted once per shape


def test_training_flops_add_the_head_to_the_body():
    assert training_flops(1000, 6e6, 1e5) == 1000 * (6e6 + 1e5)
    assert training_flops(0, 6e6, 1e5) == 0.0
    assert training_flops(1, 3.0, 0.0) == 3.0 and isinstance(training_flops(2, 3, 4), float)
