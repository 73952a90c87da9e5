"""``linlm reproduce --dry-run``: the plan of a recipe (its training runs, their compute in PFLOP/s-days, the time
or GPU-hours they need, and the evaluation sections), without running anything.

The dry run makes every check the real run makes (:func:`linlm.reproduce.job.prepare`: the recipe, --out, --set,
--scaling-dir, --data-dir, --seeds, the job's own settings when --out holds one) and writes nothing; it plans the
runs where the real run would train them (a finished run of --scaling-dir or of the job is shown as done, with no
time)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from linlm.reproduce import sections
from linlm.reproduce.layout import finished_sections
from linlm.scaling.fits import PFLOPS_DAY


def training_flops(rows) -> float:
    """FLOPs the runs of a plan will spend, the LM head included (what a GPU-hour estimate needs)."""
    return sum(r.run.training_flops for r in rows)


def print_plan(recipe_name: str, out: str | Path, file=None, overrides: Optional[dict] = None,
               seeds: Optional[int] = None, *, data_dir: Optional[str] = None, scaling_dir: Optional[str] = None,
               resume: bool = False, overwrite: bool = False, train_here: bool = False) -> dict:
    from linlm.reproduce.job import Job, prepare
    from linlm.reproduce.settings import given_settings, job_settings
    from linlm.scaling.ladder import plan_runs
    from linlm.scaling.estimate import estimate
    from linlm.scaling.plan import plan_rows
    from linlm.scaling.plan import print_plan as print_ladder
    from linlm.scaling.progress import wall_seconds

    file = file or sys.stdout
    out = Path(out).expanduser()
    given = given_settings(out, data_dir, overrides, scaling_dir, seeds)
    setup = prepare(recipe_name, out, resume=resume, overwrite=overwrite, given=given, train_here=train_here)
    recipe = setup.recipe
    job = Job(recipe, out, **job_settings(setup.settings))
    say = lambda text: print(text, file=sys.stderr)  # noqa: E731
    local = recipe.mode == "local"
    totals = {"runs": 0, "compute_flops": 0.0, "training_flops": 0.0, "seconds": 0.0}
    print(f"linlm reproduce --recipe {recipe.name}: {recipe.description}", file=file)
    for name, ladder in job.training_ladders():
        runs = plan_runs(ladder, None, job.sweep(name), job.overrides)
        rows = plan_rows(ladder, runs, say, prepare=local, strict_epochs=False)
        if local:
            estimate(rows, None, measure=True, say=say)
        print(f"\n[{name}]" + (f" {job.seed_count} seed(s) per architecture" if name == "compare" else ""),
              file=file)
        timed = (f"from training steps timed now on this machine, load average {os.getloadavg()[0]:.1f}" if local
                 else "n/a: cluster jobs")
        print_ladder(rows, ladder, timed=timed, out=file)
        totals["runs"] += len(rows)
        totals["compute_flops"] += sum(r.run.compute for r in rows)
        totals["training_flops"] += training_flops(rows)
        totals["seconds"] += wall_seconds([r.seconds or 0.0 for r in rows if r.status != "done"], ladder.jobs)
    p = recipe
    done = finished_sections(out) if setup.marker is not None else []
    print("\n[evaluation and retrieval]", file=file)
    bounded = False  # a section timed at its runs' max_steps: the total is then an upper bound
    for section in sections.SECTIONS:
        if section.plan is None:
            continue
        line = section.plan(p)
        if section.name in done:
            line += " (done)"
        elif local and section.estimate is not None:
            took = section.estimate(p)
            totals["seconds"] += took
            bounded = bounded or took > 0
            line += f" (at most {took / 60:.0f} min here, its steps timed now)" if took else ""
        print(f"  {line}", file=file)
    print_claims(job, file)
    print(f"\ntotal: {totals['runs']} training runs, C = {totals['compute_flops']:.3e} FLOPs = "
          f"{totals['compute_flops'] / PFLOPS_DAY:.3e} PFLOP/s-days (paper convention); "
          f"{totals['training_flops']:.3e} FLOPs with the LM head", file=file)
    if local:
        bound = "each MQAR and study run at its max_steps; " if bounded else ""
        print(f"training time here: about {totals['seconds'] / 60:.0f} min (steps timed now, {bound}the other "
              f"sections add about {100 * (1 - _training_share()):.0f} % on top)", file=file)
    else:
        gpu = p.gpu
        hours = totals["training_flops"] / (gpu.peak_flops * gpu.mfu) / 3600
        totals["gpu_hours"] = hours
        print(f"GPU-hours: {hours:,.0f} on {gpu.name} (peak {gpu.peak_flops:.3g} FLOP/s at {gpu.mfu:.0%} MFU"
              f"), i.e. {hours / 8 / 24:,.1f} days on 8 GPUs; `linlm reproduce --recipe {p.name} --out {out}` "
              "writes OUT/torchrun.sh with one command per run and trains nothing here (MQAR's models train "
              "where --train-here is given: a GPU node)", file=file)
    return totals


def _training_share() -> float:
    """The share of a local job's time in the sections whose training the plan times."""
    timed = [s for s in sections.SECTIONS if s.training or s.estimate is not None]
    return sum(s.weight for s in timed) / sum(s.weight for s in sections.SECTIONS)


def print_claims(job, file) -> None:
    """Which claims this recipe's settings cannot decide, and why: they will say "cannot tell" whatever the data."""
    from linlm.reproduce.claims import CLAIMS

    print("\n[claims]", file=file)
    for claim in CLAIMS:
        why = claim.undecidable(job)
        print(f"  {claim.statement}: " + (f"cannot tell with these settings: {why}" if why else
                                          "can be decided, if the data separate it"), file=file)
