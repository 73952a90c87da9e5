"""Fixtures for every test."""

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _no_allocator_tuning(monkeypatch):
    """linlm.cli.main tunes the process's allocator (linlm.runtime, a process-wide setting). Tests that call the CLI
    in-process must not change the test worker for the tests that run after them (test_trainer_api checks that
    training leaves it alone); subprocess tests still exercise the real function."""
    import linlm.runtime

    monkeypatch.setattr(linlm.runtime, "tune_allocator", lambda: None)


@pytest.fixture(autouse=True)
def _fresh_linlm_logging():
    """The CLI's setup_logging adds a handler on the stderr of its call (under capsys: that test's capture, closed
    after it) and sets the level. Each test starts and ends with the linlm logger as it found it, so that what one
    test printed or set up never reaches another's stderr."""
    import logging

    logger = logging.getLogger("linlm")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


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
