"""Fixtures of the scaling tests: a synthetic sweep, generated text, a private cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from scaling_helpers import synthetic_sweep


@pytest.fixture
def sweep(tmp_path) -> Path:
    return synthetic_sweep(tmp_path / "sweep")


@pytest.fixture(scope="session")
def cache_env(tmp_path_factory):
    """A private linlm cache (prepared data lands here, never in the user's cache)."""
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("linlm-cache")
        mp.setenv("LINLM_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="session")
def text_file(tmp_path_factory, cache_env) -> Path:
    """Generated sentences (no network): about 80k tokens under the smoke ladder's 300-entry BPE."""
    import random

    words = ("the king queen lord lady sword crown castle night day love death war peace heart blood gold fair "
             "foul speak hath thou thee doth good ill").split()
    rng = random.Random(0)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize() + "."
             for _ in range(4000)]
    path = tmp_path_factory.mktemp("text") / "tiny.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(autouse=True)
def no_allocator_tuning(monkeypatch):
    """These tests call linlm.cli.main in-process; its allocator tuning is process-wide and would leak into
    other tests of the same worker (tests/train checks that training leaves the allocator alone)."""
    import linlm.runtime

    monkeypatch.setattr(linlm.runtime, "tune_allocator", lambda *a, **k: None)
