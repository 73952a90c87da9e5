"""The memory a machine has, the refusal before a large allocation, and an allocation failure reported in one
line (linlm.resources)."""

from __future__ import annotations

import pytest
import torch

from linlm import resources
from linlm.cli_args import exit_status
from linlm.errors import ResourceError


def test_available_memory_is_read_and_is_a_plausible_figure():
    have, where = resources.available_memory()
    assert have is not None and 2**20 < have < 2**50 and where


def test_a_request_beyond_what_is_available_is_refused_naming_both(monkeypatch):
    monkeypatch.setattr(resources, "available_memory", lambda device=None: (3 * 2**30, "MemAvailable in x"))
    resources.check_memory(2 * 2**30, "--thing 5", "give less")  # fits: nothing happens
    with pytest.raises(ResourceError) as e:
        resources.check_memory(5 * 2**30, "--thing 9", "give less")
    assert str(e.value) == ("--thing 9 needs at least 5.0 GiB of memory; 3.0 GiB is available (MemAvailable in x); "
                            "give less. Nothing was started")


def test_no_figure_means_no_refusal(monkeypatch):
    monkeypatch.setattr(resources, "available_memory", lambda device=None: (None, "nothing to read"))
    resources.check_memory(2**60, "--thing", "give less")


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                 "tried to allocate 256000000000 bytes. Error code 12 (Cannot allocate memory)"),
    MemoryError(), torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
])
def test_an_allocation_failure_that_gets_through_is_one_line_exit_2(capsys, error):
    def work():
        raise error

    assert exit_status("linlm", work) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("linlm: error: out of memory: ") and "ask for less" in err
    assert "enforce fail" not in err


def test_any_other_runtime_error_is_a_bug_and_keeps_its_traceback():
    def work():
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        exit_status("linlm", work)
