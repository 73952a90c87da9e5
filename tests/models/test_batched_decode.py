"""Continuous batching: model.step over a batch of sequences of different lengths, which join (ModelState.join)
and leave (ModelState.select) between steps, gives each sequence the logits it gets decoded alone."""

from __future__ import annotations

import pytest
import torch

from linlm import create_model
from linlm.errors import ShapeError
from linlm.layers.state import ModelState
from linlm.models.registry import arch_names, get_arch

V = 64


def _model(arch):
    torch.manual_seed(0)
    return create_model(arch, preset="tiny", vocab_size=V).eval()


def _ids(n, seed):
    return torch.randint(0, V, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", arch_names())
def test_batched_steps_equal_one_sequence_at_a_time(arch):
    model = _model(arch)
    equal_lengths = get_arch(arch).position_limit  # LLaMA's KV caches: one length per batch
    lengths = [5, 5, 5, 8] if equal_lengths else [3, 7, 5, 9]  # (the fourth joins after 3 steps)
    prompts = [_ids(n, seed=i) for i, n in enumerate(lengths)]
    with torch.no_grad():
        alone = []  # each sequence decoded by itself: (logits after each step) for 6 steps
        for p in prompts:
            logits, state = model.prefill(p)
            rows = []
            for t in range(6):
                logits, state = model.step(torch.tensor([(7 * t + len(rows)) % V]), state)
                rows.append(logits[0])
            alone.append(rows)

        # Sequences 0, 1, 2 start together; 1 leaves after 2 steps; 3 joins after 3 steps.
        states, firsts = zip(*[(s, l) for l, s in (model.prefill(p) for p in prompts[:3])])
        batch = ModelState.join(states)
        live, done = [0, 1, 2], {i: 0 for i in range(4)}
        for step in range(8):
            if step == 2:
                keep = [live.index(i) for i in live if i != 1]
                batch, live = batch.select(keep), [i for i in live if i != 1]
            if step == 3:
                _, s3 = model.prefill(prompts[3])
                batch, live = ModelState.join([batch, s3]), live + [3]
            live_now = [i for i in live if done[i] < 6]
            if len(live_now) < len(live):
                batch, live = batch.select([live.index(i) for i in live_now]), live_now
            if not live:
                break
            tokens = torch.tensor([(7 * done[i] + done[i]) % V for i in live])
            logits, batch = model.step(tokens, batch)
            for row, i in enumerate(live):
                torch.testing.assert_close(logits[row], alone[i][done[i]], rtol=1e-4, atol=1e-5)
                done[i] += 1
    assert done[0] == 6 and done[2] == 6 and done[1] == 2 and done[3] >= 4


def test_rows_of_different_lengths_keep_their_offsets():
    model = _model("hgrn2")
    with torch.no_grad():
        _, a = model.prefill(_ids(3, 0))
        _, b = model.prefill(_ids(6, 1))
    joined = ModelState.join([a, b])
    assert joined.offset.tolist() == [3, 6] and joined.batch_size == 2
    assert joined.select([1]).offset == 6 and joined.select([1, 0]).offset.tolist() == [6, 3]
    assert ModelState.join([a, a]).offset == 3  # equal lengths stay one int
    with pytest.raises(ShapeError, match="not all rows"):
        joined.select([2])


def test_kv_caches_of_different_lengths_and_states_of_other_models_are_refused():
    llama = _model("llama")
    with torch.no_grad():
        _, a = llama.prefill(_ids(3, 0))
        _, b = llama.prefill(_ids(6, 1))
        _, c = _model("mamba").prefill(_ids(3, 0))
    with pytest.raises(ShapeError, match="equal lengths"):
        ModelState.join([a, b])
    with pytest.raises(ShapeError, match="different models"):
        ModelState.join([a, c])
