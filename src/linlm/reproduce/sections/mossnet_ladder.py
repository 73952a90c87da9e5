"""MossNet's scaling ladder, an optional study of a recipe: ``mossnet`` trains MossNet's ladder with Mamba and LLaMA
beside it (compute from active parameters) in DIR/mossnet; ``mossnet_fits`` fits it as the scaling sweep is
(:mod:`linlm.reproduce.sections.fits`), its report in DIR/mossnet_report. A recipe runs it when its key names a
ladder (``mossnet: {ladder: mossnet-cpu}``); without one, both sections say so in the report and train nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Union

from linlm.errors import ConfigError
from linlm.reproduce.section import Blocks, Section, Tick, heading, setting
from linlm.reproduce.sections import fits, training


def _check_ladder(spec, name: str) -> None:
    from linlm.scaling.ladder import ladder_from_dict, load_ladder

    if spec is None:
        return
    try:
        load_ladder(spec) if isinstance(spec, str) else ladder_from_dict(spec, name, "ladder")
    except ConfigError as e:
        raise ConfigError(f"ladder: {str(e).removeprefix('--ladder: ')}") from None


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



# ---- MossNet's ladder ---------------------------------------------------------------------------------------------

MOSSNET = optional_training("mossnet", 0.08, LadderSettings)
MOSSNET_PLOT = "mossnet_loss_vs_compute.png"


def run_mossnet_fits(job, tick: Tick) -> Optional[dict]:
    if not job.has_ladder("mossnet"):
        return _skipped(job, "mossnet")
    return fits.measure(job.sweep("mossnet"), job.out / "mossnet_report", job.recipe.fits)


def render_mossnet_fits(job, pending: list[str]) -> Blocks:
    b, res = heading(job, "MossNet's scaling (with Mamba and LLaMA)", pending, "mossnet_fits", "mossnet")
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
