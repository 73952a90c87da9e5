"""The sweep directory: which directories a ladder's sweep may write into, its plan.json, and its lock.

``DIR`` (``--out``) holds ``plan.json`` (the ladder and architectures it was started with), ``runs/<name>/`` and,
for ``--emit torchrun``, ``configs/<name>.yaml``. Before any work, and changing nothing, a directory is refused
that is not a sweep of this ladder (another ladder's, a user's training run, a user's files:
:func:`check_sweep_dir`), that another live process trains in, or that holds a run started with settings that
change what it computes (:func:`check_started_runs`: a finished run trained otherwise would be mixed into the
fits without a word). Everything is written through :mod:`linlm.outputs`, so it is recorded as linlm's.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from linlm import outputs
from linlm.errors import ConfigError
from linlm.locking import DirLock, check_unlocked
from linlm.scaling.ladder import Ladder, PlannedRun

PLAN_FILE = "plan.json"
SWEEP_LOCK = "scaling directory"


def _read_plan(path: Path, what: str) -> dict:
    out = path.parent
    plan, why = outputs.read_own_json(path)
    if why == "not linlm's":
        raise ConfigError(f"{what} {out}: {path.name} there was not written by linlm (or was changed since), so this "
                          "is no sweep of `linlm scaling run`; choose another directory (nothing was written)")
    if plan is None:
        raise ConfigError(f"{what} {out}: {path} is unreadable (damaged); choose another directory (nothing was "
                          "written)")
    return plan


def check_sweep_dir(out: str | Path, ladder: Ladder, what: str = "--out", *, must_exist: bool = False,
                    probe_lock: bool = True) -> Path:
    """Refuse, before any work and changing nothing, a directory ``ladder``'s sweep may not train in; return it.

    Accepted: a new path (unless ``must_exist``: a directory given to be read must be there, so a mistyped one is
    refused instead of trained into), an empty directory, or a sweep of this ladder (its plan.json written by
    linlm). Refused: a file, a place that cannot be written, a directory of someone else's files, a directory
    that is no sweep (a training run of `linlm train`, say), another ladder's sweep, and (``probe_lock``) a sweep
    that another live process is training in."""
    out = outputs.check_dir(out, what)
    if not out.exists():
        if must_exist:
            raise ConfigError(f"{what} {out}: does not exist; give the --out directory of `linlm scaling run "
                              f"--ladder {ladder.name}`, or make an empty directory to start the sweep there "
                              "(nothing was written)")
        return out
    plan = out / PLAN_FILE
    if os.path.lexists(plan):
        old = _read_plan(plan, what)
        if old.get("ladder") != ladder.name:
            raise ConfigError(f"{what} {out}: holds a sweep of ladder {old.get('ladder')!r}, not {ladder.name!r}; "
                              "choose another directory (nothing was written)")
    else:
        other = [p.name for p in sorted(out.iterdir()) if not outputs.bookkeeping(p.name)]
        if other:
            raise ConfigError(f"{what} {out}: is no sweep of `linlm scaling run` (it has no plan.json, and holds "
                              f"{outputs.shown(other)}); give a sweep directory of ladder {ladder.name!r}, or a new "
                              "or empty directory (nothing was written)")
    if probe_lock:
        check_unlocked(out, f"{what} {SWEEP_LOCK}")
    return out


def check_started_runs(runs: list[PlannedRun], what: str = "--out") -> None:
    """Refuse a plan whose settings differ from those a run of it was started with, in a key that changes what
    the run computes (the Trainer's own rule for resuming). Without this a finished run trained with other
    settings would be skipped as done and mixed into the fits, and an unfinished one would fail half way
    through the grid. Changes nothing."""
    import yaml

    from linlm.train.train_config import config_diff, is_resumable_change
    from linlm.train.rundir import RUN_CONFIG_FILE

    for r in runs:
        path = Path(r.config.out_dir) / RUN_CONFIG_FILE
        try:
            saved = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError, UnicodeDecodeError, yaml.YAMLError):
            saved = None  # unreadable: the Trainer refuses it with the reason when the run resumes
        if not isinstance(saved, dict):
            continue
        differ = [k for k in config_diff(saved, r.config.to_dict()) if not is_resumable_change(k)]
        if differ:
            raise ConfigError(f"{what}: run {r.name} there was started with a different {', '.join(differ[:4])} "
                              f"(see {path}); these change what it computes. Give the settings the sweep was "
                              "started with (--set), or another directory (nothing was written)")


@contextlib.contextmanager
def locked_sweep(out: Path, ladder: Ladder, what: str) -> Iterator[None]:
    """Create ``out`` (as linlm's) and hold its lock; the directory is checked again under the lock (another
    runner may have written its plan in between). A directory made here for nothing is removed again."""
    created = outputs.make_dir(out, what)
    lock = DirLock(out, SWEEP_LOCK)
    try:
        lock.acquire()
        check_sweep_dir(out, ladder, what, probe_lock=False)
        yield
    finally:
        lock.release()
        outputs.remove_if_unused(created)


def write_plan(out: Path, ladder: Ladder, archs: list[str], runs: list[PlannedRun], what: str) -> None:
    """Record the sweep in plan.json: its ladder, and the architectures and runs started in it so far (a later
    plan with other architectures adds to them)."""
    path = out / PLAN_FILE
    old = _read_plan(path, what) if path.is_file() else {}
    names = list(dict.fromkeys([*old.get("runs", []), *(r.name for r in runs)]))
    archs_all = list(dict.fromkeys([*old.get("archs", []), *archs]))
    outputs.write_json(path, {"ladder": ladder.name, "archs": archs_all, "runs": names}, what)
