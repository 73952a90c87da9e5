"""A tiny saved model with its tokenizer (made once per test process; nothing needs the network)."""

from __future__ import annotations

import pytest
import torch


def _corpus() -> list[str]:
    words = "the king and queen of a land far away ride north to meet their old friend at dawn".split()
    g = torch.Generator().manual_seed(0)
    return [" ".join(words[int(i)] for i in torch.randint(0, len(words), (40,), generator=g)) for _ in range(50)]


@pytest.fixture(scope="session")
def tokenizer():
    from linlm.data.tokenizer import Tokenizer

    return Tokenizer.train(_corpus(), 300)


def save_tiny(path, tokenizer, arch="llama", **kw):
    from linlm import create_model

    torch.manual_seed(0)
    model = create_model(arch, preset="tiny", vocab_size=320, **kw).eval()
    model.save(path)
    tokenizer.save(path)
    return model


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("models") / "llama"
    save_tiny(path, tokenizer, max_seq_len=64)
    return path
