"""Shared-context scoring equals scoring each choice in its own full pass, for every architecture."""

import random

import pytest
import torch

from linlm import create_model
from linlm.errors import ShapeError
from linlm.eval.scoring import Request, ScoreStats, score_requests
from linlm.models.registry import ARCHITECTURES

ARCHS = sorted(ARCHITECTURES)


def _requests(n, vocab, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ctx = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        conts = [[rng.randrange(vocab) for _ in range(rng.randint(1, 9))] for _ in range(rng.randint(1, 4))]
        out.append(Request(ctx, conts))
    return out


def _full_pass(model, req):
    """The definition: one forward over context + continuation per choice, summed log-probabilities."""
    lls, greedy = [], []
    for cont in req.continuations:
        ids = torch.tensor([req.context + cont])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids)[0].double(), -1)
        n = len(req.context)
        pred = logp[n - 1:n - 1 + len(cont)]
        tgt = torch.tensor(cont)
        lls.append(float(pred.gather(-1, tgt[:, None]).sum()))
        greedy.append(bool((pred.argmax(-1) == tgt).all()))
    return lls, greedy


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_context_equals_full_pass(arch):
    model = create_model(arch, preset="tiny").eval()
    reqs = _requests(11, model.config.vocab_size)
    stats = ScoreStats()
    shared = score_requests(model, reqs, batch_size=4, stats=stats)
    naive = score_requests(model, reqs, batch_size=3, shared=False)
    for req, s, nv in zip(reqs, shared, naive):
        ref_ll, ref_greedy = _full_pass(model, req)
        assert s.logliks == pytest.approx(ref_ll, abs=1e-5, rel=0)
        assert nv.logliks == pytest.approx(ref_ll, abs=1e-5, rel=0)
        assert s.greedy == ref_greedy == nv.greedy
    assert stats.requests == 11 and stats.truncated_requests == 0


def test_shared_context_does_less_work():
    model = create_model("tnl", preset="tiny").eval()
    reqs = [Request(list(range(1, 61)), [[5, 6, 7], [8, 9], [10], [11, 12, 13, 14]]) for _ in range(4)]
    a, b = ScoreStats(), ScoreStats()
    score_requests(model, reqs, stats=a)
    score_requests(model, reqs, shared=False, stats=b)
    assert a.forward_tokens < b.forward_tokens / 2


def test_greedy_continuation_is_detected():
    model = create_model("hgrn2", preset="tiny").eval()
    ctx = [3, 1, 4, 1, 5]
    with torch.no_grad():
        first = int(model(torch.tensor([ctx]))[0, -1].argmax())
        second = int(model(torch.tensor([ctx + [first]]))[0, -1].argmax())
    other = (first + 1) % model.config.vocab_size
    res = score_requests(model, [Request(ctx, [[first, second], [other, second]])])[0]
    assert res.greedy == [True, False]
    assert res.logliks[0] > res.logliks[1]


def test_left_truncation_is_reported_and_matches_a_cut_context():
    model = create_model("llama", preset="tiny", max_seq_len=32).eval()
    long = Request(list(range(1, 51)), [[7, 8, 9], [10]])
    stats = ScoreStats()
    res = score_requests(model, [long], stats=stats)[0]
    # Room for the context: 32 + 1 - 3 (longest continuation) = 30 tokens.
    assert res.truncated == 20 and stats.truncated_requests == 1
    ref = score_requests(model, [Request(long.context[20:], long.continuations)])[0]
    assert res.logliks == ref.logliks


def test_bad_requests_are_refused():
    model = create_model("tnl", preset="tiny").eval()
    with pytest.raises(ShapeError, match="context"):
        score_requests(model, [Request([], [[1]])])
    with pytest.raises(ShapeError, match="no tokens"):
        score_requests(model, [Request([1], [[]])])
    with pytest.raises(ShapeError, match="does not fit"):
        score_requests(model, [Request([1], [list(range(10))])], max_length=5)


def test_length_batches_group_equal_contexts():
    from linlm.eval.scoring import length_batches

    lengths = [5, 9, 9, 5, 9, 7, 9, 9, 5, 3]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches = length_batches(order, lengths, 2)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) <= 2 for b in batches)
    # The five requests of length 9 give two pure batches; one is left for a mixed batch.
    pure9 = [b for b in batches if {lengths[i] for i in b} == {9}]
    assert len(pure9) == 2 and all(len(b) == 2 for b in pure9)


@pytest.mark.parametrize("arch", ["llama", "mamba"])
def test_logits_at_equals_full_logits_at_those_positions(arch):
    """The scorer computes the head only where it reads a log-likelihood (``logits_at``), from a state too."""
    model = create_model(arch, preset="tiny").eval()
    torch.manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (3, 7))
    ids = torch.randint(0, model.config.vocab_size, (3, 5))
    rows, pos = torch.tensor([0, 2, 2, 1]), torch.tensor([4, 0, 3, 1])
    with torch.no_grad():
        state = model(prompt, return_state=True).state
        full = model(ids, state=state)
        picked = model(ids, state=state, logits_at=(rows, pos))
    assert picked.shape == (4, model.config.vocab_size)
    torch.testing.assert_close(picked, full[rows, pos], rtol=0, atol=1e-5)
