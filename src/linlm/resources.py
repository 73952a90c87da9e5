"""Memory the machine has, checked before a command allocates by a number its user gave.

A command that allocates in proportion to a user's number (a context length, a batch, a width) estimates what it
needs first (:mod:`linlm.models.memory` gives the model's share) and calls :func:`check_memory`, which refuses a
request larger than what is available, naming both, before anything is allocated or written::

    linlm: error: --contexts 1000000000: a prefill of 1,000,000,000 tokens needs at least 477 GiB of memory;
    19.8 GiB is available (MemAvailable in /proc/meminfo); give a shorter context

The estimates are lower bounds (what must be held at once, not counting the allocator's slack), so a refusal is
certain to be right; a request that passes and still runs out of memory is caught by :func:`is_out_of_memory` in
the CLI (``linlm.cli_args.exit_status``) and reported in one line.

What is available: on CUDA, the free memory of the device (``torch.cuda.mem_get_info``); on the CPU, the kernel's
``MemAvailable`` (``/proc/meminfo``), lowered to what the process's cgroup still allows (cgroup v2
``memory.max`` less ``memory.current``) when that is less; without /proc, psutil's ``available`` when psutil is
installed, else no check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from linlm.errors import ResourceError

GIB = 2**30


def _meminfo_available() -> Optional[int]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> Optional[int]:
    """What the process's cgroup (v2) still allows, or None where it sets no limit."""
    try:
        rel = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.startswith("0::"))
        base = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text().strip()))
    except (OSError, ValueError, StopIteration):
        return None


def available_memory(device=None) -> tuple[Optional[int], str]:
    """(bytes available now, where that figure comes from); (None, why) when it cannot be read."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        return int(free), f"free on {dev} (torch.cuda.mem_get_info)"
    if dev.type != "cpu":
        return None, f"no memory figure for {dev}"
    found = _meminfo_available()
    where = "MemAvailable in /proc/meminfo"
    if found is None:
        try:
            import psutil

            found, where = int(psutil.virtual_memory().available), "psutil"
        except ImportError:
            return None, "neither /proc/meminfo nor psutil"
    room = _cgroup_room()
    if room is not None and room < found:
        return room, "this process's cgroup memory.max"
    return found, where


def gib(n: float) -> str:
    """Bytes as people read them: 476.8 GiB, 12.0 MiB, 4.0 KiB."""
    if n >= GIB / 10:
        return f"{n / GIB:,.1f} GiB"
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 / 10 else f"{n / 1024:,.1f} KiB"


def check_memory(need: int, what: str, fix: str, device=None) -> None:
    """Refuse (ResourceError, one line) when ``need`` bytes exceed what is available on ``device``: ``what``
    says which request needs them ("--contexts 1000000000: a prefill of ...") and ``fix`` what to do."""
    have, where = available_memory(device)
    if have is not None and need > have:
        raise ResourceError(f"{what} needs at least {gib(need)} of memory; {gib(have)} is available ({where}); "
                            f"{fix}. Nothing was started")


_OOM_TEXT = ("can't allocate memory", "out of memory", "cannot allocate memory", "not enough memory",
             "failed to allocate")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure: MemoryError, torch.OutOfMemoryError, or the RuntimeError of
    torch's CPU allocator ("DefaultCPUAllocator: can't allocate memory")."""
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):
        pass
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _OOM_TEXT)


def out_of_memory_message(exc: BaseException) -> str:
    """The one line the CLI prints for an allocation failure that got past the estimates."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    first = first.split("] ", 1)[-1] if first.startswith("[enforce fail") else first
    return (f"out of memory: {first[:200]}; ask for less (a smaller batch, context, width or count). Files linlm "
            "writes are written whole or not at all; a training run resumes from its last checkpoint")
