"""MQAR: the generator's layout, the stream's determinism and resume, and the accuracy measure."""

import pytest
import torch
from torch import nn

from linlm.errors import ConfigError, DataError
from linlm.eval.mqar import IGNORE, MQARConfig, MQARStream, mqar_accuracy, mqar_batch, mqar_batches, state_floats
from linlm.train.checkpoint import list_checkpoints


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


def test_trainer_trains_on_mqar_and_the_experiment_reports(tmp_path):
    """The data= factory plugs into the Trainer; the experiment writes one run per model and measures it."""
    from linlm import load
    from linlm.eval.mqar import MQARRun, mqar_data, run_experiment
    from linlm.train import TrainData, build_config

    cfg = MQARConfig(vocab_size=32, num_kv=3)
    data = mqar_data(cfg)(build_config(None, {"batch_size": 4}), 0, 1)
    assert isinstance(data, TrainData) and data.vocab_size == 32 and data.tokenizer is None
    ids, tgt = next(data.train)
    assert ids.shape == (4, cfg.seq_len) and (tgt != IGNORE).sum() == 4 * 3
    moss = {"ssm_top_k": 1, "mlp_experts": 1, "mlp_top_k": 1}
    runs = [MQARRun("mossnet", 16, f"mossnet-E{e}-d16", {"ssm_experts": e, **moss}) for e in (1, 2)]
    rows = run_experiment(runs, cfg, tmp_path, steps=3, batch_size=4, head_dim=8, test_sequences=64)
    assert [r["name"] for r in rows] == ["mossnet-E1-d16", "mossnet-E2-d16"]
    for r in rows:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["answers"] == 64 * 3 and r["steps"] == 3
        model = load(list_checkpoints(tmp_path / r["name"] / "checkpoints")[-1][1])
        assert model.config.vocab_size == 32 and model.config.d_model == 16
        assert r["state_floats"] == state_floats(model, cfg.seq_len)
    # Two SSM experts hold more state than one at (nearly) the same active size: only the router differs.
    assert rows[1]["state_floats"] > rows[0]["state_floats"]
    assert abs(rows[1]["active_params"] - rows[0]["active_params"]) < 0.05 * rows[0]["active_params"]
    # A second run of the same experiment refuses to replace the first without overwrite.
    from linlm.errors import LinlmError

    with pytest.raises(LinlmError):
        run_experiment(runs[:1], cfg, tmp_path, steps=3, batch_size=4, head_dim=8, test_sequences=64)
