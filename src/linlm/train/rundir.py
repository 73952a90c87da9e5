"""The run directory: its layout, its lock, and what may happen to a run already there.

``out_dir/``::

    config.yaml          the run's TrainConfig (written once the run is known to start)
    metrics.jsonl        one JSON object per step (linlm.train.metrics)
    checkpoints/         step_XXXXXXXX/ directories (linlm.train.checkpoint)
    summary.json         the final numbers (written at the end)
    samples.txt          text sampled at the end
    loss_curve.png       the loss curve
    .lock                held by the process training here (its PID inside)
    .linlm-files.json    the ledger: what linlm wrote here (linlm.outputs)

Ownership. Every file above is written through :mod:`linlm.outputs`, which records it in its directory's ledger.
What is linlm's is read from the ledgers, never from a name: a run is *there* when linlm's own files are, and
``overwrite`` removes only the files the ledgers list (unchanged since written) and the directories linlm made,
once empty. Everything of the user's anywhere in the tree stays: a folder ``checkpoints/best_keep/``, a
``cp -r`` copy of a checkpoint under a new name, notes beside the run. A path of the user's where the new run
writes refuses the command before anything is written: a file at one of the names above, a file named
``checkpoints``, a ``checkpoints/step_XXXXXXXX`` the user made, a file of linlm's the user has changed since (and,
when the run is replaced, a user's file inside one of its checkpoints).

Policy, decided before anything is written:

* an out_dir holding another run is refused unless ``resume`` or ``overwrite``;
* ``resume`` continues from the newest checkpoint that verifies, when neither the saved config.yaml nor the
  checkpoint's own train config differs in a key that changes what the run computes
  (:func:`linlm.train.train_config.is_resumable_change`); a run whose checkpoints all fail verification is refused
  (never silently restarted); a finished run is reported as finished and left as it is;
* ``overwrite`` removes what linlm wrote, and only once the new run is about to start.

Order of work: :meth:`RunDir.check` (the policy and the paths; it writes nothing and takes no lock, so a refusal
leaves the directory byte for byte as it was), :meth:`RunDir.open` (create and lock), :meth:`RunDir.check` again
under the lock (another process may have changed the directory in between), :meth:`RunDir.start`. A directory
this process created for a run that never started is removed again.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from linlm import outputs
from linlm.errors import CheckpointError, ConfigError
from linlm.locking import DirLock
from linlm.train import checkpoint as ckpt
from linlm.train.train_config import TrainConfig, config_diff, is_resumable_change
from linlm.train.metrics import METRICS_FILE

log = logging.getLogger("linlm.train")

# The config the run was started with; each checkpoint keeps the one it was computed with (its
# checkpoint.CHECKPOINT_CONFIG_FILE).
RUN_CONFIG_FILE = "config.yaml"
SAMPLES_FILE = "samples.txt"
PLOT_FILE = "loss_curve.png"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"
# The files and the folder a run writes into its out_dir (a user's path at one of these names blocks a run).
RUN_FILES = (RUN_CONFIG_FILE, METRICS_FILE, SAMPLES_FILE, PLOT_FILE, SUMMARY_FILE, CHECKPOINT_DIR)
# A path relative to out_dir at a checkpoint's name (group 1: the rest of a path inside one).
_CHECKPOINT_PATH = re.compile(rf"^{CHECKPOINT_DIR}/step_\d{{8}}(/.*)?$")


@dataclass
class Plan:
    """What the Trainer does with the out_dir."""

    checkpoint: Optional[Path] = None  # resume from here
    finished: bool = False  # resume asked for a run that is already complete
    corrupt: list[Path] = field(default_factory=list)  # newer checkpoints that failed verification
    notes: list[str] = field(default_factory=list)  # warnings for the user, logged once the run is locked


def _differing(saved: dict, cfg: TrainConfig) -> list[str]:
    return config_diff(saved, cfg.to_dict())


class RunDir:
    """One out_dir. ``check()`` decides (writing nothing), ``open()`` creates and locks it, ``start()`` replaces
    an old run and writes config.yaml, ``close()`` unlocks (and removes a directory this process created for
    nothing)."""

    def __init__(self, out_dir: str | Path):
        self.path = Path(out_dir).expanduser()
        self.lock = DirLock(self.path, "out_dir")
        self._created: list[Path] = []

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINT_DIR

    def has_run(self) -> bool:
        """True when out_dir holds a file or folder of a run that linlm wrote (the user's files do not count)."""
        if not self.path.is_dir():
            return False
        ledger = outputs.read_ledger(self.path)
        return any(outputs.owns_dir(p) if p.is_dir() else outputs.owns_file(p, ledger)
                   for p in (self.path / name for name in RUN_FILES))

    # -- lock --

    def open(self) -> "RunDir":
        """Create out_dir (as linlm's, when it is new) and lock it."""
        self._created = outputs.make_dir(self.path, "out_dir")
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
        """Remove the directories open() created when nothing but linlm's bookkeeping was written into them."""
        outputs.remove_if_unused(self._created)
        self._created = []

    # -- checks --

    def check(self, cfg: TrainConfig, resume: bool, overwrite: bool) -> Plan:
        """Every refusal that depends on out_dir, before anything is written or locked: the directory itself, the
        policy (:meth:`plan`), and the user's paths where the run writes (:meth:`check_paths`)."""
        outputs.check_dir(self.path, "out_dir")
        plan = self.plan(cfg, resume, overwrite)
        self.check_paths(replacing=overwrite and self.has_run())
        return plan

    def blocks(self, replacing: bool):
        """Whether a user's path (relative to out_dir) is where the run writes: one of RUN_FILES, a checkpoint's
        name and, when the old run is replaced (its checkpoints written again under the same names), anything
        inside a checkpoint."""

        def blocking(rel: str) -> bool:
            if rel in RUN_FILES:
                return True
            m = _CHECKPOINT_PATH.match(rel)
            return bool(m) and (replacing or m.group(1) is None)

        return blocking

    def check_paths(self, replacing: bool) -> None:
        """Refuse (OutputError, nothing changed) when a path of the user's is where this run writes; when the old
        run is replaced, also a file of linlm's the user changed since (it would be neither kept nor replaced)."""
        if self.path.is_dir():
            outputs.check_removal(self.path, "out_dir", held=[self.path] if self.lock.held else (),
                                  blocks=self.blocks(replacing), refuse_edited=replacing)

    # -- policy --

    def saved_config(self) -> tuple[Optional[dict], Optional[str]]:
        """(config.yaml as a dict or None, why it is unusable or None)."""
        path = self.path / RUN_CONFIG_FILE
        if not path.is_file():
            return None, f"its {RUN_CONFIG_FILE} is missing"
        try:
            saved = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
            return None, f"its {RUN_CONFIG_FILE} is unreadable ({str(e).splitlines()[0]})"
        if not isinstance(saved, dict):
            return None, f"its {RUN_CONFIG_FILE} is not a mapping"
        return saved, None

    def plan(self, cfg: TrainConfig, resume: bool, overwrite: bool) -> Plan:
        """Decide, without writing anything, what a run with ``cfg`` does here."""
        out = self.path
        if resume and overwrite:
            raise ConfigError("--resume and --overwrite contradict each other; pass one of them")
        if not self.has_run():
            return Plan(notes=[f"{out} holds no run to resume; starting from step 0"] if resume else [])
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
            self._refuse_changes(_differing(saved, cfg), f"its run was made with", out / RUN_CONFIG_FILE)
        elif why and "missing" not in why:
            raise ConfigError(f"out_dir: cannot resume {out}: {why}; fix or remove it (the checkpoint keeps its own "
                              "copy), or pass --overwrite to start over")
        found, corrupt = ckpt.scan(self.checkpoints)
        if found is None and corrupt:
            names = ", ".join(p.name for p, _ in corrupt)
            raise CheckpointError(
                f"out_dir: cannot resume {out}: no checkpoint verifies ({names}: {corrupt[0][1]}). Nothing was "
                f"changed. To start over on purpose, move the damaged checkpoints out of {self.checkpoints} "
                f"(--overwrite removes only files linlm wrote, unchanged) and run the same command with --overwrite "
                f"instead of --resume, or choose another out_dir")
        if found is None:
            return Plan(notes=[f"{self.checkpoints} has no checkpoint yet; starting from step 0"])
        notes = [f"checkpoint {path} is corrupt and is skipped: {reason}" for path, reason in corrupt]
        try:
            own = yaml.safe_load((found / ckpt.CHECKPOINT_CONFIG_FILE).read_text(encoding="utf-8"))
        except (yaml.YAMLError, OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{found / ckpt.CHECKPOINT_CONFIG_FILE}: unreadable ({e})") from None
        if isinstance(own, dict):
            self._refuse_changes(_differing(own, cfg), f"its checkpoint {found.name} was made with",
                                 found / ckpt.CHECKPOINT_CONFIG_FILE)
        if saved is not None and "steps" in _differing(saved, cfg):
            notes.append(f"steps changed from {saved.get('steps')} to {cfg.steps}: the learning-rate schedule after "
                         "the checkpoint follows the new length")
        step = int(ckpt.read_state(found).get("step", 0))
        return Plan(checkpoint=found, finished=step >= cfg.steps, corrupt=[p for p, _ in corrupt], notes=notes)

    def _refuse_changes(self, differ: list[str], made_with: str, source: Path) -> None:
        blocking = [k for k in differ if not is_resumable_change(k)]
        if blocking:
            raise ConfigError(f"out_dir: cannot resume {self.path}: {made_with} a different "
                              f"{', '.join(blocking[:8])}; these change what the run computes. Resume with the saved "
                              f"config ({source}), start a new run from its weights with --init-from, or pass "
                              "--overwrite to start over")

    # -- writing --

    def start(self, cfg: TrainConfig, plan: Plan, overwrite: bool) -> None:
        """The run starts: replace the old run (``overwrite``: what linlm wrote of it), set corrupt checkpoints
        aside, write config.yaml."""
        if overwrite and self.has_run():
            outputs.remove_tree(self.path, "out_dir", held=[self.path], blocks=self.blocks(replacing=True),
                                refuse_edited=True)
        for path in plan.corrupt:
            log.warning("moved %s aside to %s", path, ckpt.set_aside(path).name)
        ckpt.clean_temporaries(self.checkpoints)
        self.write_file(RUN_CONFIG_FILE, cfg.to_yaml().encode())

    def write_file(self, name: str, data: bytes) -> Path:
        """Write ``out_dir/name`` atomically through linlm.outputs: a user's file there is refused, never
        replaced; a failure is a one-line error and leaves the old file intact."""
        return outputs.write_bytes(self.path / name, data, "out_dir")
