"""Fixtures: a tiny prepared dataset (built once per test process from generated text) and tiny configs.

Nothing here needs the network: the text is generated and the BPE is trained on it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from train_helpers import make_text, tiny_config_dict


@pytest.fixture(scope="session")
def cache_env(tmp_path_factory) -> Path:
    """A private linlm cache for this test process (never the user's)."""
    path = tmp_path_factory.mktemp("linlm-cache")
    old = os.environ.get("LINLM_CACHE_DIR")
    os.environ["LINLM_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("LINLM_CACHE_DIR", None)
    else:
        os.environ["LINLM_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("text") / "tiny.txt"
    path.write_text(make_text())
    return path


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory, text_file, cache_env) -> Path:
    """A prepared directory: BPE of 300 entries, about 60k training tokens, a 10% validation split."""
    from linlm.data.prepare import prepare

    out = tmp_path_factory.mktemp("data") / "tiny"
    prepare(str(text_file), "bpe:300", out, val_fraction=0.1, progress=False, num_workers=1, split_chars=2048)
    return out


@pytest.fixture
def make_config(tiny_data, tmp_path):
    """make_config("run", steps=6, optim__lr=1e-3) -> a validated TrainConfig (``a__b`` sets key a.b)."""
    from linlm.train.train_config import TrainConfig

    def make(out: str = "run", **top):
        return TrainConfig.from_dict(tiny_config_dict(tiny_data, tmp_path / out, **top))

    return make
