"""Fixtures: small task files in the formats of the local benchmark copies (tests/eval/data), a byte-level BPE
trained on their text and a tiny saved model with its tokenizer. Nothing here reads files outside
the repository or the network."""

import json
from pathlib import Path

import pytest
import torch

DATA = Path(__file__).parent / "data"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def fixture_texts() -> list[str]:
    texts = []
    for f in sorted(DATA.glob("*.jsonl")):
        if f.name == "wikitext2.jsonl":  # added later: left out so that the tokenizer stays the one tests were made on
            continue
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            texts.extend(v for v in rec.values() if isinstance(v, str))
            texts.extend(c for k in ("choices", "context_options") for c in rec.get(k, []))
    return texts


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def tokenizer():
    from linlm.data.tokenizer import Tokenizer

    return Tokenizer.train(fixture_texts() * 3, 300)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tokenizer) -> Path:
    """A saved tiny TNL (vocab 320) with its tokenizer beside the weights."""
    from linlm import create_model

    torch.manual_seed(1)
    model = create_model("tnl", preset="tiny", vocab_size=320)
    path = tmp_path_factory.mktemp("model") / "tnl"
    model.save(path)
    tokenizer.save(path)
    return path


@pytest.fixture(scope="session")
def pretrained_model_dir(tmp_path_factory, model_dir) -> Path:
    """The weights of ``model_dir`` beside a pretrained-style tokenizer (tokenizer.json, tokenizer_config.json,
    special_tokens_map.json: a Metaspace BPE whose BOS ``<s>`` is added) instead of linlm's own."""
    import shutil

    from tokenizer_files import write_pretrained_tokenizer

    path = tmp_path_factory.mktemp("pretrained") / "tnl"
    shutil.copytree(model_dir, path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).unlink()
    return write_pretrained_tokenizer(path, fixture_texts() * 3, vocab_size=250)
