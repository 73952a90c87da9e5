"""Fixtures of the scaling tests: a synthetic sweep (generated text and the private cache: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from scaling_helpers import synthetic_sweep


@pytest.fixture
def sweep(tmp_path) -> Path:
    return synthetic_sweep(tmp_path / "sweep")


@pytest.fixture(autouse=True)
def no_allocator_tuning(monkeypatch):
    """These tests call linlm.cli.main in-process; its allocator tuning is process-wide and would leak into
    other tests of the same worker (tests/train checks that training leaves the allocator alone)."""
    import linlm.runtime

    monkeypatch.setattr(linlm.runtime, "tune_allocator", lambda *a, **k: None)
