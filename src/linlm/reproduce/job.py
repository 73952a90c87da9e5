"""``linlm reproduce``: both studies end to end in one resumable job, then DIR/report.md and DIR/report.html.

DIR layout (everything here is written by this module and its callees)::

    reproduce.json        the marker: preset, linlm version, git revision, settings (refuses a mismatched rerun)
    scaling/              the scaling sweep (linlm scaling run layout), unless --scaling-dir names one elsewhere
    scaling_report/       the sweep's own report (IsoFLOP profiles, L(N, D), intervals)
    compare/              MossNet, Mamba and LLaMA at equal active parameters and tokens (same layout)
    mqar/                 the MQAR runs and their results
    sections/NAME.json    each finished section's numbers (a rerun skips it)
    plots/                every PNG of the report
    report.md, report.html, results.json (all sections and the claims), errors.log (a section that failed)

A rerun of the same command continues where the last one stopped: finished sections are read back, finished
training runs are skipped, an interrupted one resumes from its checkpoint.
"""

from __future__ import annotations

import json
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from linlm.errors import ConfigError, LinlmError
from linlm.io_utils import atomic_write_bytes
from linlm.locking import DirLock
from linlm.reproduce.presets import Preset, load_preset

MARKER = "reproduce.json"
FORMAT = "linlm-reproduce/1"
# Everything this module writes into DIR (the only paths --overwrite removes).
OWNED = (MARKER, "scaling", "scaling_report", "compare", "mqar", "sections", "plots", "report.md", "report.html", "results.json",
         "errors.log", "torchrun.sh")
# Sections in order, with their share of a local job's time (measured on the cpu preset; the display's
# time-left estimate is refined from the measured pace as the job runs).
SECTIONS = {"scaling": 0.55, "compare": 0.14, "fits": 0.02, "quality": 0.02, "compare_quality": 0.01,
            "zeroshot": 0.05, "niah": 0.03, "mqar": 0.14, "decode": 0.04}
TRAINING = ("scaling", "compare")
# The training sections each evaluation section reads; it waits (is not run, nor saved) until they have finished.
NEEDS = {"fits": ("scaling",), "quality": ("scaling",), "compare_quality": ("compare",),
         "zeroshot": ("scaling", "compare"), "niah": ("scaling", "compare")}


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
    path = out / MARKER
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ConfigError(f"--out: {path} is unreadable; it was not written by linlm reproduce, or is damaged. "
                          "Choose another --out directory") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"--out: {path} was not written by this version of linlm reproduce; choose another --out")
    return data


def check_directory(out: Path, preset: Preset, *, resume: bool, overwrite: bool) -> tuple[Preset, Optional[dict]]:
    """The preset to run in ``out`` and its marker; refuses a directory that another job (or not linlm) wrote."""
    import linlm

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out: {out} is a file; give a directory")
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; give one")
    marker = read_marker(out) if out.is_dir() else None
    if marker is None:
        if out.is_dir() and any(out.iterdir()):
            raise ConfigError(f"--out: {out} holds files that linlm reproduce did not write; nothing was changed. "
                              "Choose a new or empty directory")
        if resume:
            raise ConfigError(f"--resume: {out} holds no reproduce job to resume; drop --resume to start one")
        return preset, None
    same = marker.get("preset") == preset.name and marker.get("version") == linlm.__version__
    if overwrite:
        return preset, marker
    if resume:
        if marker.get("preset") != preset.name:
            preset = load_preset(marker["preset"])
        return preset, marker
    if not same:
        raise ConfigError(f"--out: {out} holds a job of preset {marker.get('preset')!r} made by linlm "
                          f"{marker.get('version')}, not preset {preset.name!r} with linlm {linlm.__version__}; "
                          "nothing was changed. Give --resume to continue that job, --overwrite to start this one "
                          "over in its place, or another --out directory")
    return preset, marker


def clear_owned(out: Path) -> None:
    """Remove what a reproduce job wrote into ``out`` (OWNED); anything else stays."""
    for name in OWNED:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


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

    def sweep(self, name: str) -> Path:
        return self.scaling_dir if name == "scaling" and self.scaling_dir else self.out / name
    results: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)

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

    # Each section returns its results, or None when it cannot run yet (its training has not finished).
    def run_section(self, name: str, tick: Callable[[float], None]) -> Optional[dict]:
        from linlm.reproduce import sections as S

        p = self.preset
        if name in TRAINING:
            ladder = self.scaling_ladder() if name == "scaling" else self.compare_ladder()
            if p.mode == "torchrun":
                return self.emit(name, ladder)
            res = S.train_sweep(ladder, self.sweep(name), tick, self.say, self.overrides)
            if res["interrupted"]:
                raise KeyboardInterrupt
            return {"ladder": ladder.name, "runs": res["done"] + res["trained"]}
        if name == "fits":
            return self.fits()
        if name == "mqar":
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

    def fits(self) -> Optional[dict]:
        from linlm.scaling.analysis import FitOptions, analyze
        from linlm.scaling.report import write_report

        root = self.sweep("scaling")
        if not (root / "runs").is_dir():
            return None
        analysis = analyze(root, options=FitOptions(**self.preset.fits))
        files = write_report(analysis, self.out / "scaling_report")
        from linlm.scaling.report import _json_default

        data = json.loads(json.dumps(analysis.to_dict(), default=_json_default))
        data["report"] = {k: str(v) for k, v in files.items()}
        return data

    def emit(self, name: str, ladder) -> Optional[dict]:
        """torchrun mode: write the commands once; the section is done when every run has finished."""
        from linlm.scaling.ladder import plan_runs
        from linlm.scaling.runner import emit_torchrun
        from linlm.scaling.runs import run_finished

        sweep = self.sweep(name)
        runs = plan_runs(ladder, None, sweep, self.overrides)
        script = self.out / "torchrun.sh"
        lines = emit_torchrun(ladder, runs, sweep)
        old = script.read_text(encoding="utf-8") if script.is_file() else "#!/usr/bin/env bash\nset -euo pipefail\n"
        if f"# {name}\n" not in old:
            atomic_write_bytes(script, (old + f"# {name}\n" + "\n".join(lines) + "\n").encode())
            script.chmod(0o755)
        pending = [r.name for r in runs if not run_finished(Path(r.config.out_dir), r.config.steps)]
        if pending:
            self.say(f"{name}: {len(pending)} of {len(runs)} runs have not finished; run {script} on the cluster, "
                     "then this command again")
            return None
        return {"ladder": ladder.name, "runs": [r.name for r in runs]}


def run(preset_name: str, out: str | Path, *, data_dir: Optional[str] = None, resume: bool = False,
        overwrite: bool = False, overrides: Optional[dict] = None, scaling_dir: Optional[str | Path] = None,
        live: bool = False, say: Callable[[str], None] = print) -> dict:
    """Run (or continue) the job; returns {"report": path, "claims": [...], "pending": [...], "failed": {...}}.
    ``overrides`` (a nested dict of TrainConfig keys, e.g. {"data": {"source": PATH}}) apply to every training
    run; a continued job keeps the ones it was started with. ``scaling_dir`` takes the scaling sweep from (and
    continues it in) a directory of ``linlm scaling run --ladder <the preset's ladder>`` instead of OUT/scaling."""
    import linlm
    from linlm.reproduce.report import write

    out = Path(out).expanduser()
    preset, marker = check_directory(out, load_preset(preset_name), resume=resume, overwrite=overwrite)
    if marker is not None and preset.name != preset_name:
        say(f"--resume: continuing the {preset.name!r} job in {out} (its preset, not {preset_name!r})")
    out.mkdir(parents=True, exist_ok=True)
    with DirLock(out, "reproduce directory"):
        if overwrite and marker is not None:
            clear_owned(out)
            marker = None
        if data_dir is None and marker is not None:
            data_dir = marker.get("data_dir")
        if marker is not None and overrides and overrides != marker.get("overrides"):
            raise ConfigError(f"--set: the job in {out} was started with {marker.get('overrides') or 'no --set'}; a "
                              "continued job keeps its settings. Drop --set, or give --overwrite to start over")
        overrides = (marker or {}).get("overrides") or overrides or {}
        scaling_dir = str(Path(scaling_dir).expanduser().resolve()) if scaling_dir else None
        if marker is not None and scaling_dir and scaling_dir != marker.get("scaling_dir"):
            raise ConfigError(f"--scaling-dir: the job in {out} uses {marker.get('scaling_dir') or out / 'scaling'}; "
                              "a continued job keeps it. Drop --scaling-dir, or give --overwrite to start over")
        scaling_dir = (marker or {}).get("scaling_dir") or scaling_dir
        new_marker = {"format": FORMAT, "preset": preset.name, "version": linlm.__version__, "data_dir": data_dir,
                      "overrides": overrides, "scaling_dir": scaling_dir,
                      "created": (marker or {}).get("created") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "versions": versions()}
        atomic_write_bytes(out / MARKER, (json.dumps(new_marker, indent=1) + "\n").encode())
        job = Job(preset, out, data_dir, say, overrides=overrides,
                  scaling_dir=Path(scaling_dir) if scaling_dir else None)
        job.plots.mkdir(parents=True, exist_ok=True)
        (out / "sections").mkdir(exist_ok=True)
        progress = JobProgress(dict(SECTIONS), live, say)
        pending = []
        try:
            for i, name in enumerate(SECTIONS, 1):
                path = job.section_path(name)
                if path.is_file():
                    job.results[name] = json.loads(path.read_text(encoding="utf-8"))
                    progress.finish(name)
                    continue
                if any(t in pending for t in NEEDS.get(name, ())):
                    pending.append(name)
                    progress.finish(name)
                    continue
                progress.start(name, i, len(SECTIONS))
                try:
                    res = job.run_section(name, progress.update)
                except KeyboardInterrupt:
                    raise
                except Exception as e:  # noqa: BLE001 - a failed section is reported, the job goes on
                    if name in TRAINING and not isinstance(e, LinlmError):
                        raise
                    job.failures[name] = f"{type(e).__name__}: {e}"
                    with open(out / "errors.log", "a", encoding="utf-8") as f:
                        f.write(f"--- {name} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n{traceback.format_exc()}\n")
                    say(f"{name}: failed ({job.failures[name]}); see {out / 'errors.log'}. The job goes on; "
                        "run the same command again to retry this section")
                    if name in TRAINING:
                        pending.append(name)
                    progress.finish(name)
                    continue
                if res is None:
                    pending.append(name)
                else:
                    job.results[name] = res
                    if "not_run" not in res:  # a section that could not run (no --data-dir) is tried again next time
                        atomic_write_bytes(path, (json.dumps(res, indent=1, default=str) + "\n").encode())
                progress.finish(name)
        finally:
            progress.close()
        report = write(job, pending, new_marker)
    return {"report": report, "claims": report.claims, "pending": pending, "failed": job.failures}
