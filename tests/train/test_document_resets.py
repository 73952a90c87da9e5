"""data.document_resets: packed documents do not see each other during training."""

from __future__ import annotations

import json
import random

import pytest
import torch
from train_helpers import WORDS, tiny_config_dict

from linlm.train import TrainConfig, TrainHooks, Trainer


@pytest.fixture(scope="module")
def short_docs(tmp_path_factory, cache_env):
    """A prepared directory of many short documents (several per 32-token sequence)."""
    from linlm.data.prepare import prepare

    rng = random.Random(0)
    root = tmp_path_factory.mktemp("docs")
    src = root / "docs.jsonl"
    with src.open("w") as f:
        for _ in range(1500):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))}) + "\n")
    out = root / "prepared"
    prepare(str(src), "bpe:300", out, val_fraction=0.1, progress=False, num_workers=1, split_chars=2048)
    return out


class FirstLoss(TrainHooks):
    def __init__(self):
        self.loss = None

    def on_step(self, record):
        if self.loss is None:
            self.loss = record["loss"]


@pytest.mark.parametrize("arch,overrides", [
    # a larger init_std makes the context matter at step 1, so that a leak across documents would show
    ("llama", {"n_layers": 2, "d_model": 32, "n_heads": 2, "glu_dim": 64, "max_seq_len": 128, "init_std": 0.2}),
    ("hgrn2", {"n_layers": 2, "d_model": 32, "n_heads": 2, "glu_dim": 64, "init_std": 0.2}),
])
def test_with_resets_the_loss_equals_the_documents_run_separately(short_docs, tmp_path, monkeypatch, arch,
                                                                  overrides):
    from linlm.data.loader import Batches, TokenDataset
    from linlm.models.lm import CausalLM

    data = tiny_config_dict(short_docs, tmp_path / "run", steps=1, eval__every=0)
    data["model"] = {"arch": arch, "overrides": overrides}
    data["data"]["document_resets"] = True
    cfg = TrainConfig.from_dict(data)

    seen = []
    real_forward = CausalLM.forward

    def spy(self, input_ids, **kwargs):
        if kwargs.get("targets") is not None:
            seen.append(kwargs.get("reset"))
        return real_forward(self, input_ids, **kwargs)

    monkeypatch.setattr(CausalLM, "forward", spy)
    hooks = FirstLoss()
    Trainer(cfg, hooks=hooks).run()
    monkeypatch.setattr(CausalLM, "forward", real_forward)

    ds = TokenDataset(short_docs, "train")
    ids, targets, reset = Batches(ds, 4, 32, seed=0, return_resets=True).batch(0)
    assert seen and seen[0] is not None and torch.equal(seen[0].cpu(), reset)
    assert reset[:, 1:].any(), "the toy data must pack several documents into a sequence"

    # the same initial weights, each document on its own
    torch.manual_seed(cfg.seed)
    model = CausalLM(cfg.model_config(vocab_size=320))
    total, count = 0.0, 0
    with torch.no_grad():
        for b in range(ids.shape[0]):
            starts = reset[b].nonzero().flatten().tolist() + [ids.shape[1]]
            for s, e in zip(starts[:-1], starts[1:]):
                loss = model(ids[b:b + 1, s:e], targets=targets[b:b + 1, s:e]).loss
                total += float(loss) * (e - s)
                count += e - s
    assert hooks.loss == pytest.approx(total / count, rel=1e-5)
    # and it differs from the packed loss without resets (documents would see each other)
    with torch.no_grad():
        packed = float(model(ids, targets=targets).loss)
    assert abs(packed - hooks.loss) > 1e-3


def test_resets_are_off_by_default(make_config, monkeypatch):
    from linlm.models.lm import CausalLM

    seen = []
    real_forward = CausalLM.forward

    def spy(self, input_ids, **kwargs):
        seen.append(kwargs.get("reset"))
        return real_forward(self, input_ids, **kwargs)

    monkeypatch.setattr(CausalLM, "forward", spy)
    Trainer(make_config("run", steps=1, eval__every=0)).run()
    assert seen and all(r is None for r in seen)
