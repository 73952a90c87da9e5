"""``linlm reproduce``: both studies end to end in one resumable job, then DIR/report.md and DIR/report.html.

The job runs the sections of :data:`linlm.reproduce.sections.SECTIONS` in order, into the directory laid out in
:mod:`linlm.reproduce.layout`. A rerun of the same command continues where the last one stopped: finished sections
are read back, finished training runs are skipped, an interrupted one resumes from its checkpoint.

**Before any work** (:func:`prepare`) everything the command was given is checked, and a refusal changes nothing
on disk, the lock file included: the recipe, --out (writable, a new or empty directory or a reproduce job, every
file the job writes there linlm's), every --set against the training config schema, --scaling-dir (an existing
sweep of the recipe's ladder, or an empty directory), --data-dir (a directory holding task files), the runs
already started in the sweeps (same settings), the live processes holding a directory --overwrite would clear.
The checks run again once the lock is taken (another process may have written in between).

**Settings of a job that has not finished** (--set, --scaling-dir, --data-dir, --seeds) can be corrected by
giving them again, as long as none of the sections they change has finished (:mod:`linlm.reproduce.settings`).

**Outcomes** are honest: a section is saved only when it finished; one that failed is logged in errors.log and
reported, and the job goes on (exit 2 once the report is written); a stop (Ctrl-C, SIGTERM) ends the job with
nothing of the stopped section saved (exit 130).
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from linlm import outputs
from linlm.environment import environment
from linlm.errors import ConfigError, LinlmError
from linlm.locking import DirLock
from linlm.progress import ProgressBar, format_duration
from linlm.reproduce.layout import FORMAT, MARKER, check_directory, finished_sections, in_the_way
from linlm.reproduce.recipes import Recipe, load_recipe
from linlm.reproduce import sections
from linlm.reproduce.section import Section
from linlm.reproduce.settings import FLAGS, check_settings, given_settings, job_settings, resolve_settings

LOCK_WHAT = "reproduce directory"


# ---- the checks before any work ---------------------------------------------------------------------------------


@dataclass
class Setup:
    """What :func:`prepare` decided: the job to run and how."""

    recipe: Recipe
    marker: Optional[dict]  # the job's marker (None: a new job, or one --overwrite starts over)
    settings: dict  # {overrides, scaling_dir, data_dir} the job runs with
    notes: list[str]  # what changed, said as the job starts
    replaced: Optional[dict] = None  # --overwrite of an existing job: its marker (what it wrote goes first)


def prepare(recipe_name: str, out: Path, *, resume: bool, overwrite: bool, given: dict, train_here: bool,
            held: tuple = ()) -> Setup:
    """Every check of the command, before any work; writes nothing. ``held``: the directories whose lock this
    process already holds (the second pass, under the lock)."""
    recipe, marker = check_directory(out, load_recipe(recipe_name), resume=resume, overwrite=overwrite)
    if train_here and recipe.mode != "torchrun":
        raise ConfigError(f"--train-here: recipe {recipe.name!r} trains every section here already; it is for "
                          "torchrun recipes (paper). Drop it (nothing was changed)")
    replaced = marker if overwrite else None
    if replaced is not None:
        outputs.check_removal(out, "--out", held=held, blocks=in_the_way)
        marker = None
    replace = replaced is not None
    finished = finished_sections(out) if marker is not None else []
    settings, notes = resolve_settings(out, marker, given, finished)
    from_marker = {k: marker and given[k] is None and marker.get(k) for k in FLAGS}
    check_settings(Job(recipe, out, **job_settings(settings)), finished, replace=replace, from_marker=from_marker)
    return Setup(recipe, marker, settings, notes, replaced)


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
        self.bar = ProgressBar("reproduce", self.total, count="percent", eta_label="left", transient=False,
                               enabled=live)

    def start(self, name: str, index: int, count: int) -> None:
        self.name, self.section = name, f"[{index}/{count}] {name}"
        self.say(f"{self.section} ({self.done_fraction():.0%} of the job done, {self.elapsed()} elapsed)")
        self.update(0.0)

    def update(self, fraction: float) -> None:
        done = self.base + self.weights.get(self.name, 0.0) * max(0.0, min(1.0, fraction))
        self.bar.update(done, info=self.section)

    def finish(self, name: str) -> None:
        self.base += self.weights.get(name, 0.0)
        self.name = ""
        self.update(0.0)

    def done_fraction(self) -> float:
        return self.base / self.total

    def elapsed(self) -> str:
        return format_duration(time.perf_counter() - self.t0)

    def close(self) -> None:
        self.bar.close()


# ---- the job ---------------------------------------------------------------------------------------------------


@dataclass
class Job:
    recipe: Recipe
    out: Path
    data_dir: Optional[str] = None
    say: Callable[[str], None] = print
    overrides: dict = field(default_factory=dict)  # TrainConfig keys for every training run (--set)
    scaling_dir: Optional[Path] = None  # an existing `linlm scaling run` sweep of the recipe's ladder
    train_here: bool = False  # torchrun recipes: train MQAR's models in this process too
    seeds: Optional[int] = None  # --seeds: the comparison's seeds instead of the recipe's
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
        """The recipe's scaling ladder, with the seed rungs its ``scaling.seeds`` adds."""
        return self.recipe.scaling.load()

    @property
    def seed_count(self) -> int:
        """How many times the comparison trains each architecture: --seeds, else the recipe's ``compare.seeds``."""
        return self.seeds or self.recipe.seeds

    def compare_ladder(self):
        """The comparison's ladder, one rung per seed when there are several (:mod:`linlm.reproduce.seeds`)."""
        from linlm.reproduce.seeds import seeded_ladder
        from linlm.scaling.ladder import ladder_from_dict

        return ladder_from_dict(seeded_ladder(self.recipe.compare.ladder, self.seed_count), "compare",
                                f"recipe {self.recipe.name}: compare")

    def ladder(self, name: str):
        if name == "scaling":
            return self.scaling_ladder()
        if name == "compare":
            return self.compare_ladder()
        return self.study_ladder(name)

    def study_ladder(self, name: str):
        """The ladder of the training section ``name`` set in the recipe's key of that name: ``{ladder: NAME}``
        (a built-in ladder) or ``{ladder: {...}}`` (a ladder mapping)."""
        from linlm.scaling.ladder import ladder_from_dict, load_ladder

        spec = getattr(self.recipe, name).ladder
        if not spec:
            raise ConfigError(f"recipe {self.recipe.name}: {name}: no ladder given")
        return load_ladder(spec) if isinstance(spec, str) else ladder_from_dict(
            spec, name, f"recipe {self.recipe.name}: {name}")

    def has_ladder(self, name: str) -> bool:
        """Whether the recipe trains the training section ``name`` (a study's section is optional)."""
        return name in ("scaling", "compare") or bool(getattr(self.recipe, name).ladder)

    def training_ladders(self) -> list:
        """(name, ladder) of every training section the recipe trains, in the order the job runs them."""
        return [(s.name, self.ladder(s.name)) for s in sections.SECTIONS
                if s.training and self.has_ladder(s.name)]

    def run_section(self, name: str, tick: Callable[[float], None]) -> Optional[dict]:
        """The section's results, or None when it cannot run yet (see :class:`linlm.reproduce.section.Section`)."""
        return sections.get(name).run(self, tick)


def run(recipe_name: str, out: str | Path, *, data_dir: Optional[str] = None, resume: bool = False,
        overwrite: bool = False, overrides: Optional[dict] = None, scaling_dir: Optional[str | Path] = None,
        train_here: bool = False, live: bool = False, say: Callable[[str], None] = print,
        seeds: Optional[int] = None) -> dict:
    """Run (or continue) the job; returns {"report", "claims", "pending", "failed", "waiting"}.

    ``overrides`` (a nested dict of TrainConfig keys, e.g. {"data": {"source": PATH}}) apply to every training
    run; ``scaling_dir`` takes the scaling sweep from (and continues it in) a directory of ``linlm scaling run
    --ladder <the recipe's ladder>`` instead of OUT/scaling; ``data_dir`` holds the zero-shot task files. A
    continued job keeps the settings it runs with unless new ones are given for sections that have not finished
    (see the module doc). ``train_here``: a torchrun recipe trains MQAR's models in this process too."""
    out = Path(out).expanduser()
    given = given_settings(out, data_dir, overrides, scaling_dir, seeds)

    def check(held: tuple = ()) -> Setup:
        return prepare(recipe_name, out, resume=resume, overwrite=overwrite, given=given, train_here=train_here,
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
        return _run(setup, recipe_name, out, train_here, live, say)
    finally:
        lock.release()


def _run(setup: Setup, recipe_name: str, out: Path, train_here: bool, live: bool,
         say: Callable[[str], None]) -> dict:
    from linlm.reproduce.report import write
    from linlm.version import __version__

    recipe, marker = setup.recipe, setup.marker
    if setup.replaced is not None:
        # The marker stays, saying the job is being replaced, until the new one is written: a removal cut short
        # (kill -9) leaves a directory that a plain rerun refuses and --overwrite finishes.
        outputs.write_json(out / MARKER, {**setup.replaced, "replacing": True}, "--out")
        outputs.remove_tree(out, "--out", held=[out], blocks=in_the_way, spare=lambda rel: rel == MARKER)
    if marker is not None and recipe.name != recipe_name:
        say(f"--resume: continuing the {recipe.name!r} job in {out} (its recipe, not {recipe_name!r})")
    for note in setup.notes:
        say(note)
    # The marker's key keeps its first name ("preset"), so that jobs started before the rename still resume.
    new_marker = {"format": FORMAT, "preset": recipe.name, "version": __version__, **setup.settings,
                  "created": (marker or {}).get("created") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "environment": environment()}
    outputs.write_json(out / MARKER, new_marker, "--out")
    job = Job(recipe, out, say=say, train_here=train_here, **job_settings(setup.settings))
    outputs.make_dir(job.plots, "--out")
    outputs.make_dir(out / "sections", "--out")
    progress = JobProgress({s.name: s.weight for s in sections.SECTIONS}, live, say)
    pending: list[str] = []
    try:
        for i, section in enumerate(sections.SECTIONS, 1):
            name = section.name
            path = job.section_path(name)
            if path.is_file():
                job.results[name] = json.loads(path.read_text(encoding="utf-8"))
            elif any(t in pending for t in section.needs):
                pending.append(name)
            else:
                progress.start(name, i, len(sections.SECTIONS))
                _run_one(job, section, progress, pending)
            progress.finish(name)
    finally:
        progress.close()
    report = write(job, pending, new_marker)
    return {"report": report, "claims": report.claims, "pending": pending, "failed": job.failures,
            "waiting": job.waiting}


def _run_one(job: Job, section: Section, progress: JobProgress, pending: list[str]) -> None:
    """Run one section; save it only when it finished. A failure is logged and the job goes on (a training
    section's bug, not a LinlmError, stops it); an interrupt stops the job."""
    name = section.name
    try:
        res = section.run(job, progress.update)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - a failed section is reported, the job goes on
        if section.training and not isinstance(e, LinlmError):
            raise
        job.failures[name] = f"{type(e).__name__}: {e}"
        outputs.append_text(job.out / "errors.log",
                            f"--- {name} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n{traceback.format_exc()}\n", "--out")
        job.say(f"{name}: failed ({job.failures[name]}); see {job.out / 'errors.log'}. The job goes on; run the "
                "same command again to retry this section")
        if section.training:
            pending.append(name)
        return
    if res is None:
        pending.append(name)
        return
    job.results[name] = res
    if "not_run" not in res:  # a section that could not run (no --data-dir) is tried again next time
        outputs.write_json(job.section_path(name), res, "--out")
