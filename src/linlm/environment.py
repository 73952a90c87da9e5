"""Where and with what a result was made: one record of the versions, the source revision and the machine.

:func:`environment` is the record every result that carries one holds (``linlm reproduce``'s marker and
results.json, ``linlm profile --json``, the ``meta`` block of every benchmark), so that a number can be traced to
the code and the machine that made it. Its keys:

- ``linlm_version``, ``torch_version``, ``numpy_version``, ``python_version``;
- ``git_revision``: the commit of the source checkout linlm runs from (None outside one), and ``git_dirty``: whether
  tracked files differ from it (None without git). Both are read once per process, when first asked for: a run
  that lasts an hour records the source it started from, not a commit made meanwhile;
- ``platform``, ``machine``, ``processor``, ``cpu_count``, ``cpu_model`` and ``cpu`` (:func:`cpu`: the model name,
  x86 family / model / stepping, the bf16-related flags, whether torch computes bf16 natively, torch's CPU
  capability and its oneDNN version);
- ``torch_num_threads`` and ``load_average_1min`` (None where the OS has none), as they are when it is called;
- ``cuda``: the CUDA version torch runs with and ``gpu``: the current CUDA device's name (None without one).
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Optional

# The checkout src/linlm lives in (when linlm runs from one).
SOURCE_ROOT = Path(__file__).resolve().parents[2]

# The CPU flags that decide how fast bfloat16 runs: AMX tiles and AVX-512 BF16 dot products compute it natively
# (oneDNN's bf16 matmuls); with AVX2 only, torch's bf16 matmul is a slow reference loop.
BF16_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def _git(root: Path, *args: str) -> Optional[subprocess.CompletedProcess]:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None


@functools.lru_cache(maxsize=None)
def git_state(root: Path = SOURCE_ROOT) -> tuple[Optional[str], Optional[bool]]:
    """(commit, dirty) of the git checkout at ``root``: ``git rev-parse HEAD`` and whether ``git status`` lists a
    changed tracked file; (None, None) outside a checkout, without git, or before the first commit."""
    rev = _git(root, "rev-parse", "HEAD")
    if rev is None or rev.returncode != 0 or not rev.stdout.strip():
        return None, None
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    dirty = None if status is None or status.returncode != 0 else bool(status.stdout.strip())
    return rev.stdout.strip(), dirty


def git_revision(root: Path = SOURCE_ROOT) -> Optional[str]:
    """The checkout's commit with ``+dirty`` when tracked files differ from it, or None outside git."""
    rev, dirty = git_state(root)
    return None if rev is None else rev + ("+dirty" if dirty else "")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu() -> dict[str, Any]:
    """The CPU: its model name, x86 family / model / stepping (a VM's model name can be as vague as "AMD EPYC";
    family 25 model 17 is Zen 4), which of :data:`BF16_FLAGS` it has, whether torch computes bf16 natively there
    (:func:`linlm.devices.native_bf16`), torch's CPU capability and its oneDNN version."""
    import torch

    from linlm.devices import native_bf16

    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    onednn = next((line.split("v", 1)[1].split()[0] for line in torch.__config__.show().splitlines()
                   if "MKL-DNN v" in line or "oneDNN v" in line), None)
    return {
        "model_name": info.get("model name") or platform.processor() or "unknown",
        "family": info.get("cpu family"),
        "model": info.get("model"),
        "stepping": info.get("stepping"),
        "bf16_flags": [f for f in BF16_FLAGS if f in flags],
        "native_bf16": native_bf16(torch.device("cpu")),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_version": onednn,
    }


def environment() -> dict[str, Any]:
    """The record of the versions, the source and the machine (the keys are in the module doc)."""
    import numpy
    import torch

    from linlm.version import __version__

    rev, dirty = git_state()
    cpu_fields = cpu()
    cuda = torch.cuda.is_available()
    return {
        "linlm_version": __version__,
        "git_revision": rev,
        "git_dirty": dirty,
        "torch_version": torch.__version__,
        "numpy_version": numpy.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_model": cpu_fields["model_name"],
        "cpu": cpu_fields,
        "cpu_count": os.cpu_count(),
        "torch_num_threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "cuda": torch.version.cuda if cuda else None,
        "gpu": torch.cuda.get_device_name() if cuda else None,
    }
