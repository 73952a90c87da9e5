"""Fixtures for every test."""

import pytest


@pytest.fixture(autouse=True)
def _no_allocator_tuning(monkeypatch):
    """linlm.cli.main tunes the process's allocator (linlm.runtime, a process-wide setting). Tests that call the CLI
    in-process must not change the test worker for the tests that run after them (test_trainer_api checks that
    training leaves it alone); subprocess tests still exercise the real function."""
    import linlm.runtime

    monkeypatch.setattr(linlm.runtime, "tune_allocator", lambda: None)
