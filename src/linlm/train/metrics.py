"""The metrics log (JSON Lines), the progress display, and the model-FLOPs-utilisation ceiling.

``out_dir/metrics.jsonl`` holds one JSON object per optimizer step::

    {"step": 12, "tokens": 49152, "loss": 5.91, "lr": 0.0003, "grad_norm": 0.84, "tokens_per_s": 10240.0,
     "step_s": 0.4, "data_s": 0.001, "mfu": 0.21, "skipped": false, "skipped_steps": 0, "time": 13.2}

``step_s`` is the wall time of the step (every micro-batch, the all-reduce and the update; not validation or
checkpointing), ``data_s`` the part of it spent fetching batches, ``time`` the seconds since the loop started.

plus ``"val_loss"`` on the steps where validation ran and ``"aux_loss"`` for mixture-of-experts models. On resume
the lines after the checkpoint's step are dropped, so the log of a resumed run reads like an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Optional

import torch

from linlm import outputs
from linlm.errors import StorageError
from linlm.progress import ProgressBar, format_duration, live_display

METRICS_FILE = "metrics.jsonl"


def read_metrics(path: str | Path) -> list[dict]:
    """Every complete record of a metrics log (a torn last line from a crash is skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "step" in rec:
            out.append(rec)
    return out


class MetricsLog:
    """Appends records to metrics.jsonl, one line per step, flushed as written.

    The log is linlm's output like any other (:mod:`linlm.outputs`): a file at its path that linlm did not write
    is refused, never appended to. linlm keeps it open itself, so it records it in the ledger as an append-only
    log (known by the sha256 of its first bytes) once it holds a line: after the rewrite that drops the lines past
    a resumed checkpoint, and after the first line of a new log. A failed write (disk full, ...) raises
    StorageError once; the log is then closed without a second attempt."""

    def __init__(self, path: str | Path, *, truncate_after: Optional[int] = None):
        self.path = outputs.check_file(path, "out_dir")
        self._broken = False
        try:
            if truncate_after is not None and self.path.exists():
                keep = [r for r in read_metrics(self.path) if r["step"] <= truncate_after]
                outputs.write_text(self.path, "".join(outputs.dumps(r, indent=None) for r in keep), "out_dir")
                outputs.record(self.path, append=True)
            self._recorded = self.path.exists() and self.path.stat().st_size > 0
            self._f = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            raise StorageError(f"{self.path}: cannot write the metrics log ({e.strerror or e}); free disk space or "
                               "fix the permissions, then run the command again") from None

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        try:
            self._f.write(outputs.dumps(clean, indent=None))
            self._f.flush()
            if not self._recorded:
                outputs.record(self.path, append=True)
                self._recorded = True
        except OSError as e:
            self._broken = True
            raise StorageError(f"{self.path}: cannot append step {record.get('step')} to the metrics log "
                               f"({e.strerror or e}); the checkpoints are intact. Free disk space, then continue "
                               "with --resume") from None

    def close(self) -> None:
        if self._f.closed:
            return
        if self._broken:  # the error was reported once; flushing the same bytes again would only fail again
            try:
                self._f.close()
            except OSError:
                pass
            return
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


def measure_peak_flops(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of a square matmul in ``dtype`` on ``device``: the ceiling MFU is measured against.

    On a CPU a 256-square probe comes first: where the dtype runs on a slow fallback (bf16 without AVX-512 or AMX,
    about 1 GFLOP/s), the ceiling is measured at that size instead of 1024, so that measuring it costs well under a
    second rather than about ten."""
    n = 4096 if device.type == "cuda" else 1024
    gen = torch.Generator(device=device).manual_seed(0)  # never touches the global RNG a checkpoint restores
    if device.type == "cpu":
        probe = torch.randn(256, 256, generator=gen).to(dtype)
        t0 = time.perf_counter()
        probe @ probe
        if (time.perf_counter() - t0) * (1024 / 256) ** 3 > 0.25:  # a 1024-square matmul would take over 0.25 s
            n = 256
    a = torch.randn(n, n, device=device, generator=gen).to(dtype)
    b = torch.randn(n, n, device=device, generator=gen).to(dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        a @ b
    sync()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def format_line(rec: dict, total_steps: int, eta: Optional[float]) -> str:
    parts = [f"step {rec['step']}/{total_steps}", f"loss {rec['loss']:.4f}" if rec.get("loss") is not None
             else "loss nan"]
    if rec.get("val_loss") is not None:
        parts.append(f"val {rec['val_loss']:.4f}")
    parts.append(f"lr {rec['lr']:.2e}")
    if rec.get("grad_norm") is not None:
        parts.append(f"gnorm {rec['grad_norm']:.2f}")
    parts.append(f"{rec['tokens_per_s'] / 1000:.1f}k tok/s")
    if rec.get("mfu") is not None:
        parts.append(f"mfu {100 * rec['mfu']:.1f}%")
    if rec.get("skipped_steps"):
        parts.append(f"skipped {rec['skipped_steps']}")
    if eta is not None:
        parts.append(f"eta {format_duration(eta)}")
    return " | ".join(parts)


class Progress:
    """The training display: a live bar (:class:`linlm.progress.ProgressBar`) on a terminal; plain log lines (every
    ``log_every`` steps) always."""

    def __init__(self, total_steps: int, start_step: int, log_every: int, enabled: bool = True,
                 live: Optional[bool] = None):
        self.total, self.start, self.log_every, self.enabled = total_steps, start_step, log_every, enabled
        self.t0 = time.perf_counter()
        self._bar = ProgressBar("train", total_steps, completed=start_step, eta_label="eta",
                                enabled=enabled and (live_display() if live is None else live))

    def eta(self, step: int) -> Optional[float]:
        done = step - self.start
        if done <= 0:
            return None
        return (time.perf_counter() - self.t0) / done * (self.total - step)

    def print(self, text: str) -> None:
        if self.enabled:
            self._bar.print(text)

    def update(self, rec: dict) -> None:
        if not self.enabled:
            return
        step = rec["step"]
        loss = rec.get("loss")
        self._bar.update(step, info=f"loss {loss:.3f}" if loss is not None else "")
        if step % self.log_every == 0 or step == self.total or rec.get("val_loss") is not None:
            self.print(format_line(rec, self.total, self.eta(step)))

    def close(self) -> None:
        self._bar.close()
