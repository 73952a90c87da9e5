"""The Trainer's Python API: hooks, an in-memory data factory, the result's finished and flops, no side effects."""

from __future__ import annotations

import torch

from linlm.train import TrainConfig, TrainData, Trainer, TrainHooks, TrainResult, train


class Recorder(TrainHooks):
    def __init__(self):
        self.start, self.steps, self.end = None, [], None

    def on_start(self, info):
        self.start = info

    def on_step(self, record):
        self.steps.append(record)

    def on_end(self, result):
        self.end = result


class Stream:
    """A deterministic, resumable in-memory stream: a repeating pattern that a model can learn."""

    def __init__(self, batch, seq_len, vocab, resets=False):
        self.batch, self.seq_len, self.vocab, self.resets, self.step = batch, seq_len, vocab, resets, 0

    def __next__(self):
        g = torch.Generator().manual_seed(self.step)
        start = torch.randint(0, self.vocab, (self.batch, 1), generator=g)
        tokens = (start + torch.arange(self.seq_len + 1)) % self.vocab
        self.step += 1
        ids, targets = tokens[:, :-1], tokens[:, 1:].clone()
        targets[:, :2] = -100
        if not self.resets:
            return ids, targets
        reset = torch.zeros_like(ids, dtype=torch.bool)
        reset[:, 0] = True
        return ids, targets, reset

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def memory_data(cfg, rank, world_size):
    stream = Stream(cfg.micro_batch(world_size), cfg.data.seq_len, 40)
    val = [next(Stream(cfg.micro_batch(world_size), cfg.data.seq_len, 40))]
    return TrainData(train=stream, val=val, vocab_size=40, fingerprint="pattern-40")


def test_hooks_see_every_step_and_the_result(make_config):
    cfg = make_config("run", steps=6)
    hooks = Recorder()
    result = Trainer(cfg, hooks=hooks).run()
    assert isinstance(result, TrainResult) and result.finished and result.step == 6
    assert hooks.start["steps"] == 6 and hooks.start["start_step"] == 0 and hooks.start["arch"] == "llama"
    assert [r["step"] for r in hooks.steps] == [1, 2, 3, 4, 5, 6]
    assert hooks.end is result
    per_token = hooks.start["training_flops_per_token"]
    assert hooks.start["flops_per_token"] == per_token  # the name it had before counted and paper FLOPs split
    assert result.flops == per_token * hooks.start["tokens_per_step"] * 6 > 0


def test_an_in_memory_data_factory_trains_and_resumes(make_config):
    cfg = make_config("mem", steps=8, data__dir=None, data__source="unused", eval__every=4,
                      checkpoint__every=4)
    first = train(cfg, data=memory_data, verbose=False)
    assert first.finished and first.loss < first_loss_bound()
    # A resumed run with the same data continues at its checkpoint; the stream gets its saved position back.
    longer = TrainConfig.from_dict({**cfg.to_dict(), "steps": 10})
    hooks = Recorder()
    again = train(longer, resume=True, data=memory_data, hooks=hooks, verbose=False)
    assert hooks.start["start_step"] == 8 and again.step == 10


def first_loss_bound() -> float:
    import math

    return math.log(40)


def test_training_and_benchmark_imports_leave_the_allocator_alone(tiny_data, tmp_path):
    """tune_allocator is a process-wide setting: only the CLI (and a benchmark's __main__) may apply it. Checked in
    fresh processes (in this one, CLI tests may have applied it already)."""
    import json
    import subprocess
    import sys

    from train_helpers import REPO, cli_env, tiny_config_dict

    cfg = json.dumps(tiny_config_dict(tiny_data, tmp_path / "run", steps=2))
    probe = ("import json, sys, linlm.runtime as r; from linlm.train import TrainConfig, train; "
             "train(TrainConfig.from_dict(json.loads(sys.argv[1])), verbose=False); print(r._applied)")
    out = subprocess.run([sys.executable, "-c", probe, cfg], env=cli_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "None"
    probe = "import _common, linlm.runtime as r; print(r._applied)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO / "benchmarks", env=cli_env(), capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "None"


def test_mfu_uses_the_counted_flops_not_the_papers(make_config):
    """The FLOPs a step is credited with are counted from the modules (with the LM head), not the paper's formula."""
    from linlm.models.cost import paper_flops_per_token
    from linlm.models.counting import count

    cfg = make_config("cost", steps=1, data__dir=None, data__source="unused")
    hooks = Recorder()
    result = Trainer(cfg, hooks=hooks, data=memory_data, verbose=False, live=False).run()
    counts = count(cfg.model_config(vocab_size=40), batch=cfg.batch_size, seq_len=cfg.data.seq_len)
    head = counts["lm_head_flops_per_token"]
    assert hooks.start["training_flops_per_token"] == counts["counted_flops_per_token"] + head
    # llama: the paper's formula differs
    assert hooks.start["training_flops_per_token"] != paper_flops_per_token(counts) + head
    assert result.flops == hooks.start["training_flops_per_token"] * cfg.batch_size * cfg.data.seq_len
