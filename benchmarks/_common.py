"""Helpers shared by the benchmark scripts: run metadata, timing, JSON results and plain-text tables.

Every script writes its numbers with `meta()` under the key "meta", so a result can be traced to a revision, a
torch build, a machine and the command that made it; benchmarks/render_results.py turns such a file into a page.
"""

from __future__ import annotations

import datetime
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from linlm.environment import environment, git_state
from linlm.io_utils import atomic_write_bytes
from linlm.outputs import dumps
from linlm.runtime import tune_allocator

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
_ALLOCATOR: Optional[dict] = None


def apply_runtime_settings() -> None:
    """What the linlm CLI does at start (linlm/runtime.py), for every model a script runs alike. Each script calls
    this from its ``__main__`` block, never on import. LINLM_ALLOCATOR=system measures with the defaults."""
    global _ALLOCATOR
    _ALLOCATOR = tune_allocator()


# Read when a script starts (it imports this module first), not when it writes its results: a run that lasts an hour
# records the source it ran, not a commit made meanwhile (linlm.environment reads the revision once per process).
git_state()


# Environment variables that change what a benchmark measures; meta() records those that are set.
RECORDED_ENV = ("OMP_NUM_THREADS", "LINLM_ALLOCATOR", "LINLM_SCAN_BACKEND", "LINLM_GPU_KERNELS", "PYTHONPATH",
                "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


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
    variables of RECORDED_ENV that were set, then linlm's record of the versions, the source revision, the CPU and
    the load (linlm.environment.environment), the allocator settings and the time."""
    return {
        "benchmark": Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else None,
        "command": command(),
        "env": {k: os.environ[k] for k in RECORDED_ENV if k in os.environ},
        **environment(),
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


def bandwidth(threads: int, gib: float = 1.0, repeat: int = 5) -> dict:
    """Read bandwidth: bytes of a float32 tensor over the fastest of `repeat` sums (wall and CPU clocks)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(int(gib * 2**30) // 4)
        x.sum()
        walls, cpus = [], []
        for _ in range(repeat):
            w, c = time.perf_counter(), time.process_time()
            x.sum()
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
        n = x.numel() * 4
        return {"threads": threads, "bytes": n, "gb_per_s_wall": n / min(walls) / 1e9,
                "gb_per_s_cpu": n / min(cpus) / 1e9}
    finally:
        torch.set_num_threads(previous)


def write_json(name: str, payload: dict) -> Path:
    """Write payload to benchmarks/results/<name>.json (atomically: a complete file or none). Returns the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    atomic_write_bytes(path, dumps(payload, indent=2).encode("utf-8"))
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
