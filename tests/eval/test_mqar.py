"""MQAR, the task: the generator's layout, the stream's determinism and resume, the test set, the accuracy measure
and the state's size. The experiment that trains models on it is tested in tests/experiments."""

import hashlib
import math
import json

import pytest
import torch
from torch import nn

from linlm.errors import ConfigError, DataError
from linlm.eval.mqar import IGNORE, MQARConfig, MQARStream, mqar_accuracy, mqar_batch, mqar_batches, state_floats


def test_batch_layout():
    cfg = MQARConfig(vocab_size=64, num_kv=6, num_queries=4)
    ids, tgt = mqar_batch(cfg, 5, torch.Generator().manual_seed(0))
    assert ids.shape == tgt.shape == (5, cfg.seq_len) == (5, 20)
    K = cfg.num_keys
    for b in range(5):
        keys, values = ids[b, 0:12:2].tolist(), ids[b, 1:12:2].tolist()
        assert len(set(keys)) == 6 and all(1 <= k <= K for k in keys) and all(K < v < 64 for v in values)
        table = dict(zip(keys, values))
        queries = ids[b, 12::2].tolist()
        assert len(set(queries)) == 4 and set(queries) <= set(keys)
        assert ids[b, 13::2].tolist() == [table[q] for q in queries]
        # Only the positions of the query keys are targets, and each target is its value.
        assert tgt[b, 12::2].tolist() == [table[q] for q in queries]
        assert (tgt[b, :12] == IGNORE).all() and (tgt[b, 13::2] == IGNORE).all()
    with pytest.raises(ConfigError, match="vocab_size"):
        MQARConfig(vocab_size=10, num_kv=8).validate()
    with pytest.raises(ConfigError, match="num_queries"):
        MQARConfig(num_kv=4, num_queries=5).validate()


def test_stream_is_a_function_of_seed_step_and_rank():
    cfg = MQARConfig(vocab_size=64, num_kv=4)
    a = MQARStream(cfg, 3, seed=7)
    first = [next(a) for _ in range(5)]
    b = MQARStream(cfg, 3, seed=7)
    next(b), next(b)
    saved = b.state_dict()
    c = MQARStream(cfg, 3, seed=7)
    c.load_state_dict(saved)
    for x, y in zip(first[2:], [next(c) for _ in range(3)]):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
    assert not torch.equal(first[0][0], first[1][0])
    other_rank = MQARStream(cfg, 3, seed=7, rank=1, world_size=2)
    assert not torch.equal(next(other_rank)[0], first[0][0])
    with pytest.raises(DataError, match="another MQAR config"):
        MQARStream(MQARConfig(vocab_size=64, num_kv=5), 3, seed=7).load_state_dict(saved)
    val = mqar_batches(cfg, 2, 4, 0, "val")
    assert not torch.equal(val[0][0], mqar_batches(cfg, 2, 4, 0, "test")[0][0])
    assert torch.equal(val[1][0], mqar_batches(cfg, 2, 4, 0, "val")[1][0])


class Oracle(nn.Module):
    """Looks each query up in the pairs before it; ``wrong`` answers of each sequence are replaced."""

    def __init__(self, cfg, wrong=0):
        super().__init__()
        self.cfg, self.wrong = cfg, wrong
        self.dummy = nn.Parameter(torch.zeros(1))

    @property
    def device(self):
        return self.dummy.device

    def forward(self, ids):
        B, T = ids.shape
        logits = torch.zeros(B, T, self.cfg.vocab_size)
        n = self.cfg.num_kv
        for b in range(B):
            table = dict(zip(ids[b, 0:2 * n:2].tolist(), ids[b, 1:2 * n:2].tolist()))
            for j, t in enumerate(range(2 * n, T, 2)):
                v = table[int(ids[b, t])]
                logits[b, t, v if j >= self.wrong else (v + 1) % self.cfg.vocab_size] = 1.0
        return logits


def test_accuracy():
    cfg = MQARConfig(vocab_size=64, num_kv=4)
    data = mqar_batches(cfg, 2, 8, 0, "test")
    assert mqar_accuracy(Oracle(cfg), data) == {"accuracy": 1.0, "sequence_accuracy": 1.0, "answers": 64}
    res = mqar_accuracy(Oracle(cfg, wrong=1), data)
    assert res["accuracy"] == pytest.approx(3 / 4) and res["sequence_accuracy"] == 0.0


def test_state_floats_constant_for_linear_models_and_growing_for_llama():
    from linlm import create_model

    tnl = create_model("tnl", preset="tiny", vocab_size=64)
    llama = create_model("llama", preset="tiny", vocab_size=64)
    assert state_floats(tnl, 8) == state_floats(tnl, 32) > 0
    assert state_floats(llama, 32) == 4 * state_floats(llama, 8)


def test_test_set_and_task_settings_mean_what_they_say():
    from linlm.eval.mqar import mqar_test_set

    cfg = MQARConfig(vocab_size=64, num_kv=4)
    # Exactly the sequences asked for; a multiple of 64 gives the batches it always gave.
    assert sum(ids.shape[0] for ids, _ in mqar_test_set(cfg, 100, 0)) == 100
    for (a, _), (b, _) in zip(mqar_test_set(cfg, 128, 0), mqar_batches(cfg, 2, 64, 0, "test")):
        assert torch.equal(a, b)
    with pytest.raises(ConfigError, match="test_sequences"):
        mqar_test_set(cfg, 0, 0)
    # "Every key" is the default, not 0; its stream is the one 0 used to seed.
    assert cfg.queries == 4
    old = hashlib.sha256(json.dumps({"mqar": {"vocab_size": 64, "num_kv": 4, "num_queries": 0}},
                                    sort_keys=True).encode()).hexdigest()[:16]
    assert cfg.fingerprint() == old
    with pytest.raises(ConfigError, match="num_queries"):
        MQARConfig(num_kv=4, num_queries=0).validate()


def test_a_gap_puts_filler_between_the_pairs_and_the_queries():
    plain, gapped = MQARConfig(vocab_size=64, num_kv=4), MQARConfig(vocab_size=64, num_kv=4, gap=5)
    assert plain.fingerprint() == MQARConfig(vocab_size=64, num_kv=4).fingerprint()  # the old identity is kept
    assert gapped.fingerprint() != plain.fingerprint() and gapped.seq_len == plain.seq_len + 5 == 21
    ids, targets = mqar_batch(gapped, 3, torch.Generator().manual_seed(0))
    assert ids.shape == (3, 21) and (ids[:, 8:13] == 0).all() and (ids[:, :8] > 0).all() and (ids[:, 13:] > 0).all()
    for b in range(3):  # each answer follows its key, after the gap
        table = dict(zip(ids[b, 0:8:2].tolist(), ids[b, 1:8:2].tolist()))
        for t in range(13, 21, 2):
            assert targets[b, t] == table[int(ids[b, t])]
        assert (targets[b, :13] == -100).all() and (targets[b, 14::2] == -100).all()
    with pytest.raises(ConfigError, match="gap"):
        MQARConfig(gap=-1).validate()


def test_a_mixture_cycles_training_through_fewer_pairs_and_leaves_the_held_out_sets_alone():
    plain, mixed = MQARConfig(vocab_size=64, num_kv=8), MQARConfig(vocab_size=64, num_kv=8, mix=(2, 4))
    assert mixed.fingerprint() != plain.fingerprint() and mixed.seq_len == plain.seq_len == 32
    stream = MQARStream(mixed.validate(), 3, seed=1)
    batches = [next(stream) for _ in range(6)]
    assert {ids.shape for ids, _ in batches} == {(3, 32)}  # one length: fewer pairs are padded at the end
    answers = [int((t != IGNORE).sum(1)[0]) for _, t in batches]
    assert answers == [2, 4, 8, 2, 4, 8]  # 2, 4, then 8 pairs (each key queried once), in turn
    ids, targets = stream.batch(4)  # 4 pairs: keys and values, every key queried once, then filler
    assert (targets[:, 8:16:2] != IGNORE).all() and (targets[:, :8] == IGNORE).all()
    assert (ids[:, 16:] == 0).all() and (targets[:, 16:] == IGNORE).all() and (ids[:, :16] > 0).all()
    for b in range(3):
        table = dict(zip(ids[b, 0:8:2].tolist(), ids[b, 1:8:2].tolist()))
        assert targets[b, 8:16:2].tolist() == [table[int(k)] for k in ids[b, 8:16:2]]
    # A batch of num_kv pairs is the step's own draw, not the plain stream's: the task's identity seeds it.
    assert not torch.equal(stream.batch(2)[0], MQARStream(plain, 3, seed=1).batch(2)[0])
    for split in ("val", "test"):  # held-out sets: num_kv pairs only, the same with or without the mixture
        for (a, _), (b, _) in zip(mqar_batches(mixed, 2, 4, 0, split), mqar_batches(plain, 2, 4, 0, split)):
            assert torch.equal(a, b) and a.shape[1] == 32
    capped = MQARConfig(vocab_size=64, num_kv=8, num_queries=3, mix=(2,))
    assert capped.at_step(0).queries == 2 and capped.at_step(1).queries == 3
    for bad in ((8,), (0, 4), (9,)):
        with pytest.raises(ConfigError, match="mix"):
            MQARConfig(vocab_size=64, num_kv=8, mix=bad).validate()


@pytest.mark.parametrize("num_kv", [4, 16])
def test_copy_loss_is_the_loss_of_copying_a_context_value_by_its_count(num_kv):
    """copy_loss against the loss measured on drawn sequences of a model that predicts each value of the context in
    proportion to how often it occurs there: 20,000 answers, whose mean loss has a standard error near 0.004."""
    cfg = MQARConfig(vocab_size=128, num_kv=num_kv)
    ids, targets = mqar_batch(cfg, 20_000 // num_kv, torch.Generator().manual_seed(0))
    values = ids[:, 1:2 * num_kv:2]
    mask = targets != IGNORE
    answers = targets[mask].view(ids.shape[0], -1)
    counts = (values[:, None, :] == answers[:, :, None]).sum(-1)
    measured = torch.log(num_kv / counts.double()).mean().item()
    assert abs(measured - cfg.copy_loss) < 0.015, (measured, cfg.copy_loss)
    assert cfg.copy_loss < math.log(num_kv) and abs(cfg.copy_loss - math.log(num_kv)) < 0.2
