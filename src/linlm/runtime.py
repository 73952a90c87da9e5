"""Process-level settings that make CPU training faster: the C allocator's thresholds.

A training step allocates and frees the same large activation tensors every step. glibc's malloc, by default,
serves blocks above its (adaptive, at most 32 MB) mmap threshold with fresh mmaps and returns free memory at the
top of the heap to the system, so those tensors come back as untouched pages the next step, and every first
write to a 4 KB page is a page fault that the kernel zero-fills. benchmarks/bench_train_step.py counts those page
faults per step beside its throughput (LINLM_ALLOCATOR=system runs it without these settings, to compare).

``tune_allocator()`` keeps freed memory in the process for reuse: blocks up to 1 GiB come from the heap, the
heap is never trimmed (mallopt's trim threshold -1), and each heap extension adds 256 MiB of slack. mallopt takes
a C int, so no setting may exceed 2^31 - 1: a larger one would reach glibc cut to its low 32 bits (4 GiB as 0,
which trims the heap at every free), and 2 GiB is below a paper-70m Mamba-2 step's peak at 2,048 tokens. The price is a
resident size that stays near its peak, which is what a training process reaches every step anyway.
The linlm CLI calls it at start and the benchmark scripts from their ``__main__`` blocks; the library (``linlm.train``
included) never does, so importing or training in-process changes nothing process-wide.
Set LINLM_ALLOCATOR=system to leave the allocator alone. Only glibc is tuned; anywhere else this does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Optional

# mallopt parameters, from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

SETTINGS = {"mmap_threshold": 1 << 30, "trim_threshold": -1, "top_pad": 256 << 20}
C_INT_MIN, C_INT_MAX = -(1 << 31), (1 << 31) - 1
_applied: Optional[dict] = None


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def tune_allocator() -> Optional[dict]:
    """Apply SETTINGS with mallopt (once per process). Returns what was applied, or None when nothing was
    (LINLM_ALLOCATOR=system, or not glibc)."""
    global _applied
    if os.environ.get("LINLM_ALLOCATOR", "").strip().lower() == "system":
        return None
    if _applied is not None:
        return dict(_applied)
    libc = _glibc()
    if libc is None:
        return None
    done = {}
    # The mmap threshold first: setting any of these switches off glibc's adaptive thresholds.
    for name, param in (("mmap_threshold", _M_MMAP_THRESHOLD), ("trim_threshold", _M_TRIM_THRESHOLD),
                        ("top_pad", _M_TOP_PAD)):
        if not C_INT_MIN <= SETTINGS[name] <= C_INT_MAX:  # ctypes would pass it cut to 32 bits, silently
            raise ValueError(f"linlm.runtime: {name} {SETTINGS[name]} does not fit mallopt's C int")
        if libc.mallopt(param, SETTINGS[name]) == 1:
            done[name] = SETTINGS[name]
    _applied = done
    return dict(done)
