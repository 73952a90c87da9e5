"""``linlm reproduce``: both studies end to end in one resumable job, then DIR/report.md and DIR/report.html.

DIR layout (every file here is written through :mod:`linlm.outputs`, so its ledgers say what is linlm's)::

    reproduce.json        the marker: preset, linlm version, git revision, settings (refuses a mismatched rerun)
    scaling/              the scaling sweep (linlm scaling run layout), unless --scaling-dir names one elsewhere
    scaling_report/       the sweep's own report (IsoFLOP profiles, L(N, D), intervals)
    compare/              MossNet, Mamba and LLaMA at equal active parameters and tokens (same layout)
    mqar/                 the MQAR runs and their results
    sections/NAME.json    each finished section's numbers (a rerun reads it back)
    plots/                every PNG of the report
    report.md, report.html, results.json (all sections and the claims), errors.log (a section that failed)

A rerun of the same command continues where the last one stopped: finished sections are read back, finished
training runs are skipped, an interrupted one resumes from its checkpoint.

**Before any work** (:func:`prepare`) everything the command was given is checked, and a refusal changes nothing
on disk, the lock file included: the preset, --out (writable, a new or empty directory or a reproduce job, every
file the job writes there linlm's), every --set against the training config schema, --scaling-dir (an existing
sweep of the preset's ladder, or an empty directory), --data-dir (a directory holding task files), the runs
already started in the sweeps (same settings), the live processes holding a directory --overwrite would clear.
The checks run again once the lock is taken (another process may have written in between).

**Settings of a job that has not finished** (--set, --scaling-dir, --data-dir) can be corrected by giving them
again: a new value is taken when no section it changes has finished (:data:`AFFECTS`), and refused, naming those
sections, when one has (a finished section is never recomputed with other settings, nor kept beside sections
computed with others). Not given, a setting keeps the job's value.
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from linlm import outputs
from linlm.errors import ConfigError, LinlmError
from linlm.locking import DirLock
from linlm.reproduce.presets import Preset, load_preset

MARKER = "reproduce.json"
FORMAT = "linlm-reproduce/1"
LOCK_WHAT = "reproduce directory"
# Sections in order, with their share of a local job's time (measured on the cpu preset; the display's
# time-left estimate is refined from the measured pace as the job runs).
SECTIONS = {"scaling": 0.55, "compare": 0.14, "fits": 0.02, "quality": 0.02, "compare_quality": 0.01,
            "zeroshot": 0.05, "niah": 0.03, "mqar": 0.14, "decode": 0.04}
TRAINING = ("scaling", "compare")
# The training sections each evaluation section reads; it waits (is not run, nor saved) until they have finished.
NEEDS = {"fits": ("scaling",), "quality": ("scaling",), "compare_quality": ("compare",),
         "zeroshot": ("scaling", "compare"), "niah": ("scaling", "compare")}
# The job's settings, their flags, and the sections whose numbers each one changes.
FLAGS = {"overrides": "--set", "scaling_dir": "--scaling-dir", "data_dir": "--data-dir"}
AFFECTS = {"overrides": ("scaling", "compare", "fits", "quality", "compare_quality", "zeroshot", "niah"),
           "scaling_dir": ("scaling", "fits", "quality", "zeroshot", "niah"),
           "data_dir": ("zeroshot",)}
# What the job writes at the top of DIR, and the trees other modules build there (a sweep, a report, MQAR).
TOP_FILES = (MARKER, "report.md", "report.html", "results.json", "errors.log", "torchrun.sh")
OWN_DIRS = ("sections", "plots")
BUILT_TREES = ("scaling", "compare", "scaling_report", "mqar")
PLOT_NAMES = ("loss_vs_compute.png", "mqar.png", "decode.png")


def written_names() -> list[str]:
    """The files this module itself writes into DIR (checked before any work: each must be free or linlm's)."""
    return [*TOP_FILES, *(f"sections/{n}.json" for n in SECTIONS), "plots/loss_vs_compute.png"]


def in_the_way(rel: str) -> bool:
    """Whether a path of DIR that is not linlm's (``rel``, '/'-separated) is where a job started over writes.

    The top-level files and directories of the layout; in sections/ and plots/, the names the job writes there
    (a user's other file stays, untouched); anywhere inside the trees other modules rebuild from nothing (the
    sweeps, the scaling report, MQAR), everything: a user's file there would be read as part of the new job."""
    parts = rel.split("/")
    if len(parts) == 1:
        return rel in TOP_FILES or rel in OWN_DIRS or rel in BUILT_TREES
    if parts[0] in BUILT_TREES:
        return True
    if parts[0] == "sections":
        return len(parts) == 2 and rel in written_names()
    if parts[0] == "plots":
        return len(parts) == 2 and (parts[1] in PLOT_NAMES or parts[1].startswith("niah_"))
    return False


def versions() -> dict[str, Any]:
    import platform

    import numpy
    import torch

    import linlm

    return {"linlm": linlm.__version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "platform": platform.platform(), "git": git_revision()}


def git_revision() -> Optional[str]:
    """The source checkout's commit (with ``+dirty`` when it has uncommitted changes), or None outside git."""
    import subprocess

    root = Path(__file__).resolve().parents[3]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


# ---- the directory ---------------------------------------------------------------------------------------------


def read_marker(out: Path) -> Optional[dict]:
    """The job's marker, or None when DIR holds none; refuses one that linlm did not write or cannot read."""
    path = out / MARKER
    if not path.exists() and not path.is_symlink():
        return None
    data, why = outputs.read_own_json(path)
    if why == "not linlm's":
        raise ConfigError(f"--out: {path} was not written by linlm reproduce (or was changed since); nothing was "
                          "changed. Choose another --out directory")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"--out: {path} was not written by this version of linlm reproduce, or is damaged; "
                          "nothing was changed. Choose another --out directory")
    return data


def check_directory(out: Path, preset: Preset, *, resume: bool, overwrite: bool) -> tuple[Preset, Optional[dict]]:
    """The preset to run in ``out`` and its marker; refuses (changing nothing) a directory that is not free nor a
    reproduce job, a job of another preset or version (without --resume or --overwrite), and --resume with
    nothing to resume."""
    import linlm

    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; give one (nothing was changed)")
    outputs.check_dir(out, "--out", names=written_names())
    marker = read_marker(out) if out.is_dir() else None
    if marker is None:
        other = [p.name for p in sorted(out.iterdir()) if not outputs.bookkeeping(p.name)] if out.is_dir() else []
        if other:
            raise ConfigError(f"--out: {out} holds files that linlm reproduce did not write ({outputs.shown(other)});"
                              " nothing was changed. Choose a new or empty directory")
        if resume:
            raise ConfigError(f"--resume: {out} holds no reproduce job to resume; drop --resume to start one "
                              "(nothing was changed)")
        return preset, None
    if overwrite:
        return preset, marker
    if marker.get("replacing"):
        raise ConfigError(f"--out: the job in {out} was being started over (--overwrite) when it stopped, and part "
                          "of what it wrote is gone; run the command with --overwrite again (nothing was changed)")
    if resume:
        if marker.get("preset") != preset.name:
            preset = load_preset(marker["preset"])
        return preset, marker
    if marker.get("preset") != preset.name or marker.get("version") != linlm.__version__:
        raise ConfigError(f"--out: {out} holds a job of preset {marker.get('preset')!r} made by linlm "
                          f"{marker.get('version')}, not preset {preset.name!r} with linlm {linlm.__version__}; "
                          "nothing was changed. Give --resume to continue that job, --overwrite to start this one "
                          "over in its place, or another --out directory")
    return preset, marker


def finished_sections(out: Path) -> list[str]:
    return [n for n in SECTIONS if (out / "sections" / f"{n}.json").is_file()]


def _shown_setting(key: str, value: Any) -> str:
    if key == "overrides":
        return " ".join(f"--set {k}={v}" for k, v in _flat(value or {})) or "no --set"
    if key == "scaling_dir":
        return value or "the job's own sweep (DIR/scaling)"
    return value or "no --data-dir"


def _flat(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in tree.items():
        out += _flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [(f"{prefix}{k}", v)]
    return out


def given_settings(out: Path, data_dir: Optional[str | Path], overrides: Optional[dict],
                   scaling_dir: Optional[str | Path]) -> dict:
    """The settings a command gives, as the marker stores them (None: not given). Paths are made absolute, and
    --scaling-dir DIR/scaling is the job's own sweep, as if not given."""
    sweep = str(Path(scaling_dir).expanduser().resolve()) if scaling_dir else None
    if sweep == str((out / "scaling").resolve()):
        sweep = None
    return {"overrides": overrides or None, "scaling_dir": sweep,
            "data_dir": str(Path(data_dir).expanduser().resolve()) if data_dir else None}


def resolve_settings(out: Path, marker: Optional[dict], given: dict, finished: list[str]) -> tuple[dict, list[str]]:
    """The settings the job runs with, and a note for each one that changes. A setting not given keeps the job's;
    one given anew is taken when none of the sections it changes has finished, and refused otherwise."""
    if marker is None:
        return dict(given), []
    settings, notes = {}, []
    for key, flag in FLAGS.items():
        old, new = marker.get(key) or None, given[key]
        if new is None or new == old:
            settings[key] = old
            continue
        done = [s for s in AFFECTS[key] if s in finished]
        if done:
            raise ConfigError(f"{flag}: the job in {out} runs with {_shown_setting(key, old)}, and its finished "
                              f"sections {', '.join(done)} were computed with it; a finished section is never "
                              f"recomputed with other settings. Give the job's {flag} again (or drop it), or "
                              "--overwrite to start the job over (nothing was changed)")
        settings[key] = new
        notes.append(f"{flag}: the job ran with {_shown_setting(key, old)}; from now on {_shown_setting(key, new)} "
                     f"(none of the sections it changes, {', '.join(AFFECTS[key])}, has finished)")
    return settings, notes


def check_settings(job: "Job", finished: list[str], *, replace: bool, from_marker: dict) -> None:
    """Refuse, changing nothing, settings the job could not run with: a --set the training config does not
    take, a --scaling-dir that is no sweep of the preset's ladder (or missing, or inside --out), a --data-dir
    without task files, a sweep whose runs were started otherwise or that another process trains in. Only the
    settings of sections still to run are checked; ``replace``: the job's own sweeps are about to be removed."""
    from linlm.reproduce.sections import check_task_dir
    from linlm.scaling.ladder import plan_runs
    from linlm.scaling.sweepdir import check_started_runs, check_sweep_dir

    todo = [s for s in SECTIONS if s not in finished]

    def kept(key: str) -> str:  # a setting the command did not give comes from the job: say so, and how to fix it
        return " (kept from the job's reproduce.json: give it again to correct it)" if from_marker.get(key) else ""

    if job.scaling_dir is not None and any(s in todo for s in AFFECTS["scaling_dir"]):
        sweep, out = job.scaling_dir.resolve(), job.out.resolve()
        if sweep == out or out in sweep.parents or sweep in out.parents:
            raise ConfigError(f"--scaling-dir: {sweep} and --out {out} are inside one another; give a sweep "
                              "directory outside the job (or drop --scaling-dir for the job's own DIR/scaling) "
                              "(nothing was changed)")
        check_sweep_dir(job.scaling_dir, job.scaling_ladder(), "--scaling-dir" + kept("scaling_dir"),
                        must_exist=True)
    for name in TRAINING:
        if name in finished:
            continue
        ladder = job.ladder(name)
        try:
            runs = plan_runs(ladder, None, job.sweep(name), job.overrides)
        except ConfigError as e:
            raise ConfigError(f"--set{kept('overrides')}: {e}; nothing was changed") from None
        external = name == "scaling" and job.scaling_dir is not None  # checked above; never removed
        if not (external or replace):
            check_sweep_dir(job.sweep(name), ladder, "--out")
        if external or not replace:
            check_started_runs(runs, job.sweep_flag(name))
    if "zeroshot" in todo and job.data_dir:
        check_task_dir(job.data_dir, job.preset.zeroshot.get("tasks"), "--data-dir" + kept("data_dir"))


@dataclass
class Setup:
    """What :func:`prepare` decided: the job to run and how."""

    preset: Preset
    marker: Optional[dict]  # the job's marker (None: a new job, or one --overwrite starts over)
    settings: dict  # {overrides, scaling_dir, data_dir} the job runs with
    notes: list[str]  # what changed, said as the job starts
    replaced: Optional[dict] = None  # --overwrite of an existing job: its marker (what it wrote goes first)


def prepare(preset_name: str, out: Path, *, resume: bool, overwrite: bool, given: dict, train_here: bool,
            held: tuple = ()) -> Setup:
    """Every check of the command, before any work; writes nothing. ``held``: the directories whose lock this
    process already holds (the second pass, under the lock)."""
    preset, marker = check_directory(out, load_preset(preset_name), resume=resume, overwrite=overwrite)
    if train_here and preset.mode != "torchrun":
        raise ConfigError(f"--train-here: preset {preset.name!r} trains every section here already; it is for "
                          "torchrun presets (paper). Drop it (nothing was changed)")
    replaced = marker if overwrite else None
    if replaced is not None:
        outputs.check_removal(out, "--out", held=held, blocks=in_the_way)
        marker = None
    replace = replaced is not None
    finished = finished_sections(out) if marker is not None else []
    settings, notes = resolve_settings(out, marker, given, finished)
    from_marker = {k: marker and given[k] is None and marker.get(k) for k in FLAGS}
    check_settings(Job(preset, out, **_job_settings(settings)), finished, replace=replace, from_marker=from_marker)
    return Setup(preset, marker, settings, notes, replaced)


def _job_settings(settings: dict) -> dict:
    return {"data_dir": settings["data_dir"], "overrides": settings["overrides"] or {},
            "scaling_dir": Path(settings["scaling_dir"]) if settings["scaling_dir"] else None}


# ---- progress --------------------------------------------------------------------------------------------------


class JobProgress:
    """One display for the whole job: the section, its detail, the job's share done and the time left."""

    def __init__(self, weights: dict[str, float], live: bool, say: Callable[[str], None]):
        self.weights = weights
        self.total = sum(weights.values()) or 1.0
        self.base = 0.0
        self.name = ""
        self.section = ""
        self.say = say
        self.t0 = time.perf_counter()
        self.bar = None
        self.last_print = 0.0
        if live:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("reproduce"), BarColumn(), TextColumn("{task.percentage:>4.0f}%"),
                                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("left"),
                                TimeRemainingColumn(), console=Console(stderr=True))
            self.bar.start()
            self.task = self.bar.add_task("reproduce", total=self.total, info="")

    def start(self, name: str, index: int, count: int) -> None:
        self.name, self.section = name, f"[{index}/{count}] {name}"
        self.say(f"{self.section} ({self.done_fraction():.0%} of the job done, {self.elapsed()} elapsed)")
        self.update(0.0)

    def update(self, fraction: float) -> None:
        done = self.base + self.weights.get(self.name, 0.0) * max(0.0, min(1.0, fraction))
        if self.bar is not None:
            self.bar.update(self.task, completed=done, info=self.section)

    def finish(self, name: str) -> None:
        self.base += self.weights.get(name, 0.0)
        self.name = ""
        self.update(0.0)

    def done_fraction(self) -> float:
        return self.base / self.total

    def elapsed(self) -> str:
        from linlm.train.metrics import format_duration

        return format_duration(time.perf_counter() - self.t0)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


# ---- the job ---------------------------------------------------------------------------------------------------


@dataclass
class Job:
    preset: Preset
    out: Path
    data_dir: Optional[str] = None
    say: Callable[[str], None] = print
    overrides: dict = field(default_factory=dict)  # TrainConfig keys for every training run (--set)
    scaling_dir: Optional[Path] = None  # an existing `linlm scaling run` sweep of the preset's ladder
    train_here: bool = False  # torchrun presets: train MQAR's models in this process too
    results: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)
    waiting: dict = field(default_factory=dict)  # section -> why it has not run yet (beyond its training)

    def sweep(self, name: str) -> Path:
        return self.scaling_dir if name == "scaling" and self.scaling_dir else self.out / name

    def sweep_flag(self, name: str) -> str:
        """The flag that gave a training section's directory (for its errors)."""
        return "--scaling-dir" if name == "scaling" and self.scaling_dir else "--out"

    @property
    def plots(self) -> Path:
        return self.out / "plots"

    def section_path(self, name: str) -> Path:
        return self.out / "sections" / f"{name}.json"

    def scaling_ladder(self):
        from linlm.scaling.ladder import load_ladder

        return load_ladder(self.preset.scaling["ladder"])

    def compare_ladder(self):
        from linlm.scaling.ladder import ladder_from_dict

        return ladder_from_dict(self.preset.compare, "compare", f"preset {self.preset.name}: compare")

    def ladder(self, name: str):
        return self.scaling_ladder() if name == "scaling" else self.compare_ladder()

    # Each section returns its results, or None when it cannot run yet (its training has not finished).
    def run_section(self, name: str, tick: Callable[[float], None]) -> Optional[dict]:
        from linlm.reproduce import sections as S

        p = self.preset
        if name in TRAINING:
            return self.emit(name) if p.mode == "torchrun" else self.train(name, tick)
        if name == "fits":
            return self.fits()
        if name == "mqar":
            if p.mode == "torchrun" and not self.train_here:
                self.waiting[name] = (f"preset {p.name} trains MQAR's models on the cluster's GPUs, not here: run "
                                      f"`linlm reproduce --preset {p.name} --out {self.out} --train-here` on a GPU "
                                      "node")
                return None
            return S.mqar(p.mqar, self.out / "mqar", self.plots, tick)
        if name == "decode":
            return S.decode(p.decode, self.compare_ladder().archs, self.plots, tick)
        models = S.trained_models(self.sweep("compare" if name == "compare_quality" else "scaling"), largest_only=True)
        if name in ("zeroshot", "niah"):
            compare = S.trained_models(self.sweep("compare"), largest_only=True)
            models = {**models, **{f"compare-{k}": v for k, v in compare.items()}}
        if not models:
            return None
        if name in ("quality", "compare_quality"):
            return S.quality(models, int(p.quality.get("max_tokens", 40_000)), tick)
        if name == "zeroshot":
            return S.zeroshot(models, self.data_dir, p.zeroshot.get("tasks"), p.zeroshot.get("limit"), tick)
        if name == "niah":
            return S.niah(models, p.niah, self.plots, tick)
        raise AssertionError(name)

    def train(self, name: str, tick: Callable[[float], None]) -> dict:
        """A training section: the sweep trained here. An interrupted sweep stops the job (KeyboardInterrupt, exit
        130); the section is done only when every run of it has reached its steps."""
        from linlm.reproduce import sections as S
        from linlm.scaling.ladder import plan_runs
        from linlm.scaling.runs import run_finished

        ladder, sweep = self.ladder(name), self.sweep(name)
        res = S.train_sweep(ladder, sweep, tick, self.say, self.overrides, self.sweep_flag(name))
        if res["interrupted"]:
            raise KeyboardInterrupt
        runs = plan_runs(ladder, None, sweep, self.overrides)
        unfinished = [r.name for r in runs if not run_finished(Path(r.config.out_dir), r.config.steps)]
        if unfinished:
            raise LinlmError(f"{name}: {len(unfinished)} of {len(runs)} runs did not reach their steps "
                             f"({outputs.shown(unfinished)}); run the same command again to resume them")
        return {"ladder": ladder.name, "runs": [r.name for r in runs]}

    def fits(self) -> Optional[dict]:
        from linlm.scaling.analysis import FitOptions, analyze
        from linlm.scaling.report import write_report

        root = self.sweep("scaling")
        if not (root / "runs").is_dir():
            return None
        analysis = analyze(root, options=FitOptions(**self.preset.fits))
        files = write_report(analysis, self.out / "scaling_report")
        data = json.loads(outputs.dumps(analysis.to_dict()))
        data["report"] = {k: str(v) for k, v in files.items()}
        return data

    def emit(self, name: str) -> Optional[dict]:
        """torchrun mode: write the commands once; the section is done when every run has finished."""
        from linlm.scaling.ladder import plan_runs
        from linlm.scaling.plan import emit_torchrun
        from linlm.scaling.runs import run_finished

        ladder, sweep = self.ladder(name), self.sweep(name)
        runs = plan_runs(ladder, None, sweep, self.overrides)
        script = self.out / "torchrun.sh"
        old = script.read_text(encoding="utf-8") if script.is_file() else "#!/usr/bin/env bash\nset -euo pipefail\n"
        if f"# {name}\n" not in old:
            lines = emit_torchrun(ladder, runs, sweep, self.sweep_flag(name))
            outputs.write_text(script, old + f"# {name}\n" + "\n".join(lines) + "\n", "--out")
            script.chmod(0o755)
        pending = [r.name for r in runs if not run_finished(Path(r.config.out_dir), r.config.steps)]
        if pending:
            self.waiting[name] = (f"{len(pending)} of {len(runs)} runs have not finished; run {script} on the "
                                  "cluster, then this command again")
            self.say(f"{name}: {self.waiting[name]}")
            return None
        return {"ladder": ladder.name, "runs": [r.name for r in runs]}


def run(preset_name: str, out: str | Path, *, data_dir: Optional[str] = None, resume: bool = False,
        overwrite: bool = False, overrides: Optional[dict] = None, scaling_dir: Optional[str | Path] = None,
        train_here: bool = False, live: bool = False, say: Callable[[str], None] = print) -> dict:
    """Run (or continue) the job; returns {"report", "claims", "pending", "failed", "waiting"}.

    ``overrides`` (a nested dict of TrainConfig keys, e.g. {"data": {"source": PATH}}) apply to every training
    run; ``scaling_dir`` takes the scaling sweep from (and continues it in) a directory of ``linlm scaling run
    --ladder <the preset's ladder>`` instead of OUT/scaling; ``data_dir`` holds the zero-shot task files. A
    continued job keeps the settings it runs with unless new ones are given for sections that have not finished
    (see the module doc). ``train_here``: a torchrun preset trains MQAR's models in this process too."""
    out = Path(out).expanduser()
    given = given_settings(out, data_dir, overrides, scaling_dir)

    def check(held: tuple = ()) -> Setup:
        return prepare(preset_name, out, resume=resume, overwrite=overwrite, given=given, train_here=train_here,
                       held=held)

    check()
    created = outputs.make_dir(out, "--out")
    lock = DirLock(out, LOCK_WHAT)
    try:
        lock.acquire()
        setup = check(held=(out,))  # again under the lock: another process may have written here in between
    except BaseException:
        lock.release()
        outputs.remove_if_unused(created)
        raise
    try:
        return _run(setup, preset_name, out, train_here, live, say)
    finally:
        lock.release()


def _run(setup: Setup, preset_name: str, out: Path, train_here: bool, live: bool,
         say: Callable[[str], None]) -> dict:
    import linlm
    from linlm.reproduce.report import write

    preset, marker = setup.preset, setup.marker
    if setup.replaced is not None:
        # The marker stays, saying the job is being replaced, until the new one is written: a removal cut short
        # (kill -9) leaves a directory that a plain rerun refuses and --overwrite finishes.
        outputs.write_json(out / MARKER, {**setup.replaced, "replacing": True}, "--out")
        outputs.remove_tree(out, "--out", held=[out], blocks=in_the_way, spare=lambda rel: rel == MARKER)
    if marker is not None and preset.name != preset_name:
        say(f"--resume: continuing the {preset.name!r} job in {out} (its preset, not {preset_name!r})")
    for note in setup.notes:
        say(note)
    new_marker = {"format": FORMAT, "preset": preset.name, "version": linlm.__version__, **setup.settings,
                  "created": (marker or {}).get("created") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "versions": versions()}
    outputs.write_json(out / MARKER, new_marker, "--out")
    job = Job(preset, out, say=say, train_here=train_here, **_job_settings(setup.settings))
    outputs.make_dir(job.plots, "--out")
    outputs.make_dir(out / "sections", "--out")
    progress = JobProgress(dict(SECTIONS), live, say)
    pending: list[str] = []
    try:
        for i, name in enumerate(SECTIONS, 1):
            path = job.section_path(name)
            if path.is_file():
                job.results[name] = json.loads(path.read_text(encoding="utf-8"))
            elif any(t in pending for t in NEEDS.get(name, ())):
                pending.append(name)
            else:
                progress.start(name, i, len(SECTIONS))
                _run_one(job, name, progress, pending)
            progress.finish(name)
    finally:
        progress.close()
    report = write(job, pending, new_marker)
    return {"report": report, "claims": report.claims, "pending": pending, "failed": job.failures,
            "waiting": job.waiting}


def _run_one(job: Job, name: str, progress: JobProgress, pending: list[str]) -> None:
    """Run one section; save it only when it finished. A failure is logged and the job goes on (a training
    section's bug, not a LinlmError, stops it); an interrupt stops the job."""
    try:
        res = job.run_section(name, progress.update)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - a failed section is reported, the job goes on
        if name in TRAINING and not isinstance(e, LinlmError):
            raise
        job.failures[name] = f"{type(e).__name__}: {e}"
        outputs.append_text(job.out / "errors.log",
                            f"--- {name} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n{traceback.format_exc()}\n", "--out")
        job.say(f"{name}: failed ({job.failures[name]}); see {job.out / 'errors.log'}. The job goes on; run the "
                "same command again to retry this section")
        if name in TRAINING:
            pending.append(name)
        return
    if res is None:
        pending.append(name)
        return
    job.results[name] = res
    if "not_run" not in res:  # a section that could not run (no --data-dir) is tried again next time
        outputs.write_json(job.section_path(name), res, "--out")
