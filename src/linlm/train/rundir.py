"""The run directory: its layout, its lock, and what may happen to a run already there.

``out_dir/``::

    config.yaml          the run's TrainConfig (written once the run is known to start)
    metrics.jsonl        one JSON object per step (linlm.train.metrics)
    checkpoints/         step_XXXXXXXX/ directories (linlm.train.checkpoint)
    summary.json         the final numbers (written at the end)
    samples.txt          text sampled at the end
    loss_curve.png       the loss curve
    .lock                held by the process training here (its PID inside)

Policy, decided before anything is written:

* an out_dir holding another run is refused unless ``resume`` or ``overwrite``;
* ``resume`` continues from the newest checkpoint that verifies, when neither the saved config.yaml nor the
  checkpoint's own train config differs in a key that changes what the run computes
  (:func:`linlm.train.config.is_resumable_change`); a run whose checkpoints all fail verification is refused
  (never silently restarted); a finished run is reported as finished and left as it is;
* ``overwrite`` removes exactly the files a run writes, and only once the new run is about to start.

A refused command leaves the directory as it found it; a directory this process created for a run that never
started is removed again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from linlm.errors import CheckpointError, ConfigError
from linlm.io_utils import atomic_write_bytes
from linlm.locking import LOCK_FILE, DirLock
from linlm.train import checkpoint as ckpt
from linlm.train.config import TrainConfig, config_diff, is_resumable_change
from linlm.train.metrics import METRICS_FILE

log = logging.getLogger("linlm.train")

CONFIG_FILE = "config.yaml"
SAMPLES_FILE = "samples.txt"
PLOT_FILE = "loss_curve.png"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"
# Files and folders a run writes into its out_dir (--overwrite removes exactly these).
RUN_FILES = (CONFIG_FILE, METRICS_FILE, SAMPLES_FILE, PLOT_FILE, SUMMARY_FILE, CHECKPOINT_DIR)


@dataclass
class Plan:
    """What the Trainer does with the out_dir."""

    checkpoint: Optional[Path] = None  # resume from here
    finished: bool = False  # resume asked for a run that is already complete
    corrupt: list[Path] = field(default_factory=list)  # newer checkpoints that failed verification


def _differing(saved: dict, cfg: TrainConfig) -> list[str]:
    return config_diff(saved, cfg.to_dict())


class RunDir:
    """One out_dir. ``open()`` creates and locks it, ``plan()`` decides, ``start()`` writes config.yaml,
    ``close()`` unlocks (and removes a directory this process created for nothing)."""

    def __init__(self, out_dir: str | Path):
        self.path = Path(out_dir).expanduser()
        self.lock = DirLock(self.path, "out_dir")
        self._created: list[Path] = []

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINT_DIR

    def has_run(self) -> bool:
        return any((self.path / name).exists() for name in RUN_FILES)

    # -- lock --

    def open(self) -> "RunDir":
        out = self.path
        if out.exists() and not out.is_dir():
            raise ConfigError(f"out_dir: {out} is a file; choose a directory")
        self._created = [p for p in (out, *out.parents) if not p.exists()]
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self._created = []
            raise ConfigError(f"out_dir: cannot create {out} ({e.strerror or e}); choose a writable directory") \
                from None
        try:
            self.lock.acquire()
        except BaseException:
            self._remove_if_unused()
            raise
        return self

    def close(self) -> None:
        self.lock.release()
        self._remove_if_unused()

    def _remove_if_unused(self) -> None:
        """Remove the directories open() created when nothing but the lock file was written into them."""
        if not self._created:
            return
        with contextlib.suppress(OSError):
            if all(p.name == LOCK_FILE for p in self.path.iterdir()):
                (self.path / LOCK_FILE).unlink(missing_ok=True)
                for path in self._created:
                    path.rmdir()
        self._created = []

    # -- policy --

    def saved_config(self) -> tuple[Optional[dict], Optional[str]]:
        """(config.yaml as a dict or None, why it is unusable or None)."""
        path = self.path / CONFIG_FILE
        if not path.is_file():
            return None, f"its {CONFIG_FILE} is missing"
        try:
            saved = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
            return None, f"its {CONFIG_FILE} is unreadable ({str(e).splitlines()[0]})"
        if not isinstance(saved, dict):
            return None, f"its {CONFIG_FILE} is not a mapping"
        return saved, None

    def plan(self, cfg: TrainConfig, resume: bool, overwrite: bool) -> Plan:
        """Decide, without writing anything, what a run with ``cfg`` does here."""
        out = self.path
        if resume and overwrite:
            raise ConfigError("--resume and --overwrite contradict each other; pass one of them")
        if not self.has_run():
            if resume:
                log.warning("%s holds no run to resume; starting from step 0", out)
            return Plan()
        if overwrite:
            return Plan()
        saved, why = self.saved_config()
        if not resume:
            if saved is None:
                what = f"a run ({why})"
            else:
                differ = _differing(saved, cfg)
                what = (f"a run with a different config (differs at {', '.join(differ[:8])})" if differ
                        else "a run with this config")
            raise ConfigError(f"out_dir: {out} already holds {what}; pass --resume to continue it, --overwrite to "
                              "delete it and start over, or choose another out_dir")
        if saved is not None:
            self._refuse_changes(_differing(saved, cfg), f"its run was made with", out / CONFIG_FILE)
        elif why and "missing" not in why:
            raise ConfigError(f"out_dir: cannot resume {out}: {why}; fix or remove it (the checkpoint keeps its own "
                              "copy), or pass --overwrite to start over")
        found, corrupt = ckpt.scan(self.checkpoints)
        if found is None and corrupt:
            names = ", ".join(p.name for p, _ in corrupt)
            raise CheckpointError(
                f"out_dir: cannot resume {out}: no checkpoint verifies ({names}: {corrupt[0][1]}). Nothing was "
                f"changed. To start over on purpose, run the same command with --overwrite instead of --resume "
                f"(this deletes the run's checkpoints and metrics), or choose another out_dir")
        if found is None:
            log.warning("%s has no checkpoint yet; starting from step 0", self.checkpoints)
            return Plan()
        for path, reason in corrupt:
            log.warning("checkpoint %s is corrupt and is skipped: %s", path, reason)
        try:
            own = yaml.safe_load((found / ckpt.CONFIG_FILE).read_text(encoding="utf-8"))
        except (yaml.YAMLError, OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{found / ckpt.CONFIG_FILE}: unreadable ({e})") from None
        if isinstance(own, dict):
            self._refuse_changes(_differing(own, cfg), f"its checkpoint {found.name} was made with",
                                 found / ckpt.CONFIG_FILE)
        if saved is not None and "steps" in _differing(saved, cfg):
            log.warning("steps changed from %s to %s: the learning-rate schedule after the checkpoint follows the "
                        "new length", saved.get("steps"), cfg.steps)
        step = int(ckpt.read_state(found).get("step", 0))
        return Plan(checkpoint=found, finished=step >= cfg.steps, corrupt=[p for p, _ in corrupt])

    def _refuse_changes(self, differ: list[str], made_with: str, source: Path) -> None:
        blocking = [k for k in differ if not is_resumable_change(k)]
        if blocking:
            raise ConfigError(f"out_dir: cannot resume {self.path}: {made_with} a different "
                              f"{', '.join(blocking[:8])}; these change what the run computes. Resume with the saved "
                              f"config ({source}), start a new run from its weights with --init-from, or pass "
                              "--overwrite to start over")

    # -- writing --

    def start(self, cfg: TrainConfig, plan: Plan, overwrite: bool) -> None:
        """The run starts: replace the old run (``overwrite``), set corrupt checkpoints aside, write config.yaml."""
        if overwrite and self.has_run():
            self._remove_run()
        for path in plan.corrupt:
            log.warning("moved %s aside to %s", path, ckpt.set_aside(path).name)
        ckpt.clean_temporaries(self.checkpoints)
        self.write_file(CONFIG_FILE, cfg.to_yaml().encode())

    def write_file(self, name: str, data: bytes) -> Path:
        """Write ``out_dir/name`` atomically; a failure is a one-line error and leaves the old file intact."""
        path = self.path / name
        try:
            atomic_write_bytes(path, data)
        except OSError as e:
            raise ConfigError(f"out_dir: cannot write {path} ({e.strerror or e}); nothing was half-written. Free "
                              "disk space or fix the permissions, then run the command again") from None
        return path

    def _remove_run(self) -> None:
        for name in RUN_FILES:
            path = self.path / name
            if path.is_dir():
                trash = self.path / f".{name}.trash"
                os.replace(path, trash)
                shutil.rmtree(trash, ignore_errors=True)
            elif path.exists():
                path.unlink()
