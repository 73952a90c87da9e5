"""Helpers shared by the benchmark scripts: run metadata, timing, JSON results and plain-text tables.

Every script writes its numbers with `meta()` under the key "meta", so a result can be traced to a revision, a
torch build, a machine and the command that made it; benchmarks/render_results.py turns such a file into a page.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from linlm.runtime import tune_allocator

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
_ALLOCATOR: Optional[dict] = None


def apply_runtime_settings() -> None:
    """What the linlm CLI does at start (linlm/runtime.py), for every model a script runs alike. Each script calls
    this from its ``__main__`` block, never on import. LINLM_ALLOCATOR=system measures with the defaults."""
    global _ALLOCATOR
    _ALLOCATOR = tune_allocator()


def _git_revision() -> str:
    """`git rev-parse HEAD` of the repository holding this folder, or "unknown" (no git, no commits yet, ...)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    rev = out.stdout.strip()
    return rev if out.returncode == 0 and rev else "unknown"


def _git_dirty() -> Optional[bool]:
    """Whether tracked files differ from HEAD (the numbers then come from uncommitted code), or None without git."""
    try:
        out = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=HERE, capture_output=True, timeout=10,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: False, 1: True}.get(out.returncode)


def _cpuinfo() -> dict:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields: dict = {}
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


def _cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or "unknown"


# The CPU flags that decide how fast bfloat16 runs: AMX tiles and AVX-512 BF16 dot products compute it natively
# (oneDNN's bf16 matmuls); with AVX2 only, torch's bf16 matmul is a slow reference loop.
BF16_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_meta() -> dict:
    """The CPU a result was measured on: its model name, x86 family / model / stepping (a VM's model name can be as
    vague as "AMD EPYC"; family 25 model 17 is Zen 4), which of BF16_FLAGS it has, whether torch computes bf16
    natively there (linlm.devices.native_bf16), torch's CPU capability and its oneDNN version."""
    from linlm.devices import native_bf16

    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    onednn = next((line.split("v", 1)[1].split()[0] for line in torch.__config__.show().splitlines()
                   if "MKL-DNN v" in line or "oneDNN v" in line), None)
    return {
        "model_name": _cpu_model(),
        "family": info.get("cpu family"),
        "model": info.get("model"),
        "stepping": info.get("stepping"),
        "bf16_flags": [f for f in BF16_FLAGS if f in flags],
        "native_bf16": native_bf16(torch.device("cpu")),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_version": onednn,
    }


# Read when a script starts (it imports this module first), not when it writes its results: a run that lasts an hour
# records the source it ran, not a commit made meanwhile.
_REVISION = _git_revision()
_DIRTY = _git_dirty()


# Environment variables that change what a benchmark measures; meta() records those that are set.
RECORDED_ENV = ("OMP_NUM_THREADS", "LINLM_ALLOCATOR", "LINLM_SCAN_BACKEND", "LINLM_GPU_KERNELS", "PYTHONPATH")


def command() -> str:
    """This process's command line as one could type it again: `python benchmarks/bench_x.py ARGS`, the script's
    path relative to the repository when it lies inside it."""
    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    if script is not None and script.is_relative_to(HERE.parent):
        shown = str(script.relative_to(HERE.parent))
    else:
        shown = sys.argv[0] if sys.argv else "?"
    return " ".join(["python", shlex.quote(shown), *(shlex.quote(a) for a in sys.argv[1:])])


def meta() -> dict:
    """Where and with what a result was measured: the script (`benchmark`), its command line and the environment
    variables of RECORDED_ENV that were set, the source revision, torch, the CPU and the load."""
    return {
        "benchmark": Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else None,
        "command": command(),
        "env": {k: os.environ[k] for k in RECORDED_ENV if k in os.environ},
        "git_revision": _REVISION,
        "git_dirty": _DIRTY,
        "torch_version": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "python_version": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_model": _cpu_model(),
        "cpu": cpu_meta(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "allocator_settings": _ALLOCATOR,
        "utc_time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def time_fn(fn, warmup: int = 2, repeat: int = 5) -> float:
    """Median wall-clock seconds of `repeat` calls of fn(), after `warmup` untimed calls."""
    if repeat < 1:
        raise ValueError(f"time_fn: repeat must be at least 1, got {repeat}")
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def write_json(name: str, payload: dict) -> Path:
    """Write payload to benchmarks/results/<name>.json (atomically: a complete file or none). Returns the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def print_table(headers, rows) -> None:
    """Print rows (sequences of values) under headers as an aligned plain-text table."""
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = "  ".join("-" * w for w in widths)
    print("  ".join(c.ljust(w) for c, w in zip(cells[0], widths)))
    print(line)
    for r in cells[1:]:
        print("  ".join(c.rjust(w) if _numeric(c) else c.ljust(w) for c, w in zip(r, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e5 else f"{v:.2f}"
    return str(v)


def _numeric(s: str) -> bool:
    try:
        float(s.rstrip("x"))
        return True
    except ValueError:
        return False
