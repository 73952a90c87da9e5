"""The optional studies of a recipe, each a training section and the section that reads it:

- ``aspect`` / ``aspect_loss``: one size at several (d_model, n_layers) shapes (a ladder with an aspect study,
  :mod:`linlm.scaling.studies`), in DIR/aspect; the validation loss per shape per architecture
  (:func:`linlm.scaling.shapes.study_losses`) and its spread across shapes;
- ``context`` / ``context_loss``: one model at several training contexts on the same tokens, in DIR/context;
  scored at each run's own context and at the shortest one (the spread is taken there);
- ``mossnet`` / ``mossnet_fits``: MossNet's scaling ladder with Mamba and LLaMA beside it (compute from active
  parameters), in DIR/mossnet; L(C) and the rest fitted as the scaling sweep is (:mod:`linlm.reproduce.sections.fits`),
  its report in DIR/mossnet_report.

A recipe runs a study when its key names a ladder (``aspect: {ladder: aspect-cpu}``); without one, each of these
sections says so in the report and trains nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from linlm import outputs
from linlm.errors import ConfigError
from linlm.reproduce.section import Blocks, Section, Tick, heading, image, setting
from linlm.reproduce.sections import fits, training
from linlm.scaling.shapes import DEFAULT_MAX_TOKENS


def _check_ladder(spec, name: str) -> None:
    from linlm.scaling.ladder import ladder_from_dict, load_ladder

    if spec is None:
        return
    try:
        load_ladder(spec) if isinstance(spec, str) else ladder_from_dict(spec, name, "ladder")
    except ConfigError as e:
        raise ConfigError(f"ladder: {str(e).removeprefix('--ladder: ')}") from None


@dataclass
class StudySettings:
    """A shape study's key (``aspect:``, ``context:``)."""

    ladder: Optional[Union[str, dict]] = setting(None, "its ladder: a built-in ladder's name or a ladder mapping "
                                                       "(null: the study is not run)")
    max_tokens: int = setting(DEFAULT_MAX_TOKENS, "validation tokens scored per run")

    def validate(self) -> "StudySettings":
        _check_ladder(self.ladder, "study")
        if self.max_tokens < 2:
            raise ConfigError(f"max_tokens: {self.max_tokens}; give at least 2 tokens to score")
        return self


@dataclass
class LadderSettings:
    """``mossnet:``: MossNet's ladder with its baselines."""

    ladder: Optional[Union[str, dict]] = setting(None, "its ladder: a built-in ladder's name or a ladder mapping "
                                                       "(null: not run)")

    def validate(self) -> "LadderSettings":
        _check_ladder(self.ladder, "mossnet")
        return self


def _skipped(job, name: str) -> dict:
    return {"not_run": f"recipe {job.recipe.name} gives no {name} ladder (its key {name}: {{ladder: NAME}} runs it)"}


def _ladder_line(name: str):
    def plan(recipe) -> str:
        spec = getattr(recipe, name).ladder
        shown = spec if isinstance(spec, str) else (spec or {}).get("name", name)
        return f"{name}: ladder {shown!r} (its runs are listed above)" if spec else f"{name}: not in this recipe"
    return plan


def optional_training(name: str, weight: float, options: type) -> Section:
    """A training section that runs only when the recipe gives its ladder (else it reports why not)."""
    base = dataclasses.replace(training.training_section(name, weight, ("overrides",)), key=name, options=options)

    def run(job, tick: Tick) -> Optional[dict]:
        return base.run(job, tick) if job.has_ladder(name) else _skipped(job, name)

    def check(job, kept, replace: bool) -> None:
        if job.has_ladder(name):
            base.check(job, kept, replace)

    return dataclasses.replace(base, run=run, check=check, plan=_ladder_line(name))


def _not_run_blocks(b: Blocks, res: dict) -> Optional[Blocks]:
    return b + [("p", f"Skipped: {res['not_run']}.")] if "not_run" in res else None


# ---- the studies ------------------------------------------------------------------------------------------------


def measure_study(sweep: Path, settings: StudySettings, plots: Path, name: str, tick: Tick) -> Optional[dict]:
    from linlm.scaling.shapes import plot_study, study_losses

    res = study_losses(sweep, max_tokens=settings.max_tokens, on_fraction=tick)
    if res is None:
        return None
    res["plot"] = f"{name}.png"
    outputs.write_bytes(plots / res["plot"], plot_study(res, f"{name} study"), "--out")
    return res


def _opened(job, title: str, pending: list[str], *names: str) -> tuple[Blocks, Optional[dict]]:
    """A section's heading and its result, or (the blocks to show, None) when it is pending or did not run."""
    b, res = heading(job, title, pending, *names)
    if res is None:
        return b, None
    skipped = _not_run_blocks(b, res)
    return (skipped, None) if skipped is not None else (b, res)


def study_section(name: str, sweep: str, title: str, weight: float, rank: int, about: str) -> Section:
    def run(job, tick: Tick) -> Optional[dict]:
        if not job.has_ladder(sweep):
            return _skipped(job, sweep)
        return measure_study(job.sweep(sweep), getattr(job.recipe, sweep), job.plots, sweep, tick)

    def render(job, pending: list[str]) -> Blocks:
        from linlm.scaling.shapes import study_table

        b, res = _opened(job, title, pending, name, sweep)
        if res is None:
            return b
        b.append(("p", f"Ladder {job.study_ladder(sweep).name!r}: {len(res['runs'])} runs. {about} Loss: validation "
                       f"loss (nats/token) on the first {res['max_tokens']:,} validation tokens, in disjoint windows; "
                       "each shape's loss is the mean over its seeds. Spread: the largest minus the smallest loss "
                       "across shapes; seed range: the largest max - min across the seeds of one shape."))
        head, rows = study_table(res)
        b.append(("table", head, rows))
        img = image(job, res["plot"])
        if img:
            b.append(img)
        return b

    return Section(name, run, weight, needs=(sweep,), settings=("overrides",), render=render, report_rank=rank,
                   plots=(f"{sweep}.png",), key=sweep, options=StudySettings)


ASPECT = optional_training("aspect", 0.10, StudySettings)
ASPECT_LOSS = study_section(
    "aspect_loss", "aspect", "Shape: aspect ratio (d_model / n_layers at one size)", 0.01, 8,
    "Every shape has about the same non-embedding parameters and trains on the same tokens (the paper's 1B study: "
    "d/l = 1536/32, 1792/24, 2048/18, 3072/8). Scored at the training context.")
CONTEXT = optional_training("context", 0.06, StudySettings)
CONTEXT_LOSS = study_section(
    "context_loss", "context", "Shape: training context length", 0.01, 9,
    "One model trained at each context on the same tokens with the same tokens per step (the paper's 1B model at "
    "2K, 4K and 16K). Scored at the shortest context, which every run trained on (the spread is taken there), "
    "and at each run's own context.")


# ---- MossNet's ladder ---------------------------------------------------------------------------------------------

MOSSNET = optional_training("mossnet", 0.08, LadderSettings)
MOSSNET_PLOT = "mossnet_loss_vs_compute.png"


def run_mossnet_fits(job, tick: Tick) -> Optional[dict]:
    if not job.has_ladder("mossnet"):
        return _skipped(job, "mossnet")
    return fits.measure(job.sweep("mossnet"), job.out / "mossnet_report", job.recipe.fits)


def render_mossnet_fits(job, pending: list[str]) -> Blocks:
    b, res = _opened(job, "MossNet's scaling (with Mamba and LLaMA)", pending, "mossnet_fits", "mossnet")
    if res is None:
        return b
    return b + fits.laws_blocks(
        res, f"Ladder {job.study_ladder('mossnet').name!r}: {len(res['runs'])} runs. N and C count active parameters "
        "and FLOPs (a mixture of experts counts the k routed experts a token uses, not all E). L(C) = beta C^alpha "
        "fitted on each architecture's envelope, C in PFLOP/s-days, with 95 % bootstrap intervals; the full report "
        "is mossnet_report/report.md.", MOSSNET_PLOT, interval=True, paper=False)


MOSSNET_FITS = Section("mossnet_fits", run_mossnet_fits, 0.01, needs=("mossnet",), settings=("overrides",),
                       render=render_mossnet_fits, report_rank=10, trees=("mossnet_report",), plots=(MOSSNET_PLOT,),
                       copies=(f"plots/{MOSSNET_PLOT}",))
