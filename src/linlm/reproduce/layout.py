"""The directory of a ``linlm reproduce`` job: what the job writes there, its marker, and whether a command may
use a directory at all (a new or empty one, or a reproduce job, every file the job writes there linlm's).

DIR layout (every file here is written through :mod:`linlm.outputs`, so its ledgers say what is linlm's)::

    reproduce.json        the marker: recipe, linlm version, git revision, settings (refuses a mismatched rerun)
    scaling/              the scaling sweep (linlm scaling run layout), unless --scaling-dir names one elsewhere
    scaling_report/       the sweep's own report (IsoFLOP profiles, L(N, D), intervals)
    compare/              MossNet, Mamba and LLaMA at equal active parameters and tokens (same layout)
    mqar/                 the MQAR runs and their results
    aspect/, context/     the optional shape studies (linlm scaling run layout), where the recipe names them
    mossnet/              MossNet's scaling ladder with Mamba and LLaMA (same layout), where the recipe names it
    mossnet_report/       its own scaling report
    sections/NAME.json    each finished section's numbers (a rerun reads it back)
    plots/                every PNG of the report
    report.md, report.html, results.json (all sections and the claims), errors.log (a section that failed)

The trees and plots each section writes are declared by its record (:mod:`linlm.reproduce.sections`).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path
from typing import Optional

from linlm import outputs
from linlm.errors import ConfigError
from linlm.reproduce.recipes import Recipe, load_recipe
from linlm.reproduce import sections

MARKER = "reproduce.json"
FORMAT = "linlm-reproduce/1"
# What the job writes at the top of DIR, and the directories of its own there.
TOP_FILES = (MARKER, "report.md", "report.html", "results.json", "errors.log", "torchrun.sh")
OWN_DIRS = ("sections", "plots")


def written_names() -> list[str]:
    """The files this module itself writes into DIR (checked before any work: each must be free or linlm's)."""
    every = sections.SECTIONS
    return [*TOP_FILES, *(f"sections/{s.name}.json" for s in every), *(c for s in every for c in s.copies)]


def in_the_way(rel: str) -> bool:
    """Whether a path of DIR that is not linlm's (``rel``, '/'-separated) is where a job started over writes.

    The top-level files and directories of the layout; in sections/ and plots/, the names the job writes there
    (a user's other file stays, untouched); anywhere inside the trees the sections rebuild from nothing (the
    sweeps, the scaling report, MQAR), everything: a user's file there would be read as part of the new job."""
    parts = rel.split("/")
    trees = {t for s in sections.SECTIONS for t in s.trees}
    if len(parts) == 1:
        return rel in TOP_FILES or rel in OWN_DIRS or rel in trees
    if parts[0] in trees:
        return True
    if parts[0] == "sections":
        return len(parts) == 2 and rel in written_names()
    if parts[0] == "plots":
        return len(parts) == 2 and any(fnmatchcase(parts[1], p) for s in sections.SECTIONS for p in s.plots)
    return False


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


def check_directory(out: Path, recipe: Recipe, *, resume: bool, overwrite: bool) -> tuple[Recipe, Optional[dict]]:
    """The recipe to run in ``out`` and its marker; refuses (changing nothing) a directory that is not free nor a
    reproduce job, a job of another recipe or version (without --resume or --overwrite), and --resume with
    nothing to resume."""
    from linlm.version import __version__

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
        return recipe, None
    if overwrite:
        return recipe, marker
    if marker.get("replacing"):
        raise ConfigError(f"--out: the job in {out} was being started over (--overwrite) when it stopped, and part "
                          "of what it wrote is gone; run the command with --overwrite again (nothing was changed)")
    if resume:
        if marker.get("preset") != recipe.name:
            recipe = load_recipe(marker["preset"])
        return recipe, marker
    if marker.get("preset") != recipe.name or marker.get("version") != __version__:
        raise ConfigError(f"--out: {out} holds a job of recipe {marker.get('preset')!r} made by linlm "
                          f"{marker.get('version')}, not recipe {recipe.name!r} with linlm {__version__}; "
                          "nothing was changed. Give --resume to continue that job, --overwrite to start this one "
                          "over in its place, or another --out directory")
    return recipe, marker


def finished_sections(out: Path) -> list[str]:
    return [s.name for s in sections.SECTIONS if (out / "sections" / f"{s.name}.json").is_file()]
