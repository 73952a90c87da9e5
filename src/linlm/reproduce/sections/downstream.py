"""The ``downstream`` section: benchmark scores against training compute, as the scaling paper's figure of them
(arXiv 2406.16690, which scored its intermediate checkpoints). Each run of the scaling ladder keeps
``scaling.keep_log`` log-spaced checkpoints along training (model-only, linlm.train.checkpoint); each one is scored
by :mod:`linlm.scaling.downstream` (the commonsense average, LAMBADA and WikiText-2 from --data-dir; NIAH in easy
mode by choice, always) and placed at its training compute, with one plot per measure and a power law where one is
fitted (the perplexities).

Files: DIR/downstream/ (one JSON per checkpoint, so a job run again scores only what is missing, and
summary.json) and DIR/plots/downstream_*.png. No claim reads it. Where no checkpoint is above chance on NIAH, the
report says that the measure cannot order the architectures at this scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from linlm.errors import ConfigError
from linlm.reproduce.section import Blocks, Section, Tick, fmt, heading, image, setting

MAX_TRIALS = 1000


@dataclass
class DownstreamSettings:
    """The recipe's ``downstream:`` (the checkpoints it scores are kept by ``scaling.keep_log``)."""

    limit: Optional[int] = setting(200, "items scored per zero-shot task at each kept checkpoint (null: every item)")
    trials: int = setting(4, "NIAH trials per cell at each kept checkpoint")

    def validate(self) -> "DownstreamSettings":
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit: {self.limit}; give at least 1 item per task, or null for every item")
        if not 1 <= self.trials <= MAX_TRIALS:
            raise ConfigError(f"trials: {self.trials}; give 1 to {MAX_TRIALS} NIAH trials per cell")
        return self


def run(job, tick: Tick) -> Optional[dict]:
    from linlm import outputs
    from linlm.scaling.downstream import evaluate_sweep, kept_checkpoints

    keep = job.recipe.scaling.keep_log
    if not keep:
        return {"not_run": f"recipe {job.recipe.name} keeps no checkpoints along training (its key scaling: "
                           "{keep_log: N} keeps N log-spaced ones per run)"}
    s, sweep, out = job.recipe.downstream, job.sweep("scaling"), job.out / "downstream"
    try:
        runs = kept_checkpoints(sweep)
    except ConfigError as e:  # a sweep trained without them (--scaling-dir): nothing to score, the rest stands
        return {"not_run": str(e)}
    total = sum(len(c) for _, c in runs.values())
    done = [0]

    def progress(run: str, step: int, cached: bool) -> None:
        done[0] += 1
        tick(done[0] / max(total, 1))

    summary = evaluate_sweep(sweep, data_dir=job.data_dir, limit=s.limit, trials=s.trials, progress=progress,
                             out=out, runs=runs)
    plots = [outputs.copy_file(out / name, job.plots / f"downstream_{name}", "plot").name
             for name in summary["plots"]]
    return {"keep_log": keep, "limit": s.limit, "trials": s.trials, "with_tasks": bool(job.data_dir),
            "points": summary["points"], "fits": summary["fits"], "plots": plots}


def render(job, pending: list[str]) -> Blocks:
    from linlm.scaling.downstream import MEASURES

    b, res = heading(job, "Downstream scores against compute", pending, "downstream")
    if res is None:
        return b
    points = res["points"]
    shown = [m for m in MEASURES if any(m in p for p in points)]
    items = "every item" if res.get("limit") is None else f"at most {res['limit']} items per task"
    tasks = (f"the commonsense average, LAMBADA and WikiText-2 ({items}) and " if res.get("with_tasks")
             else "(no --data-dir: no zero-shot task) ")
    b.append(("p", f"As the paper's figure of benchmark scores along training: {len(points)} checkpoints of "
                   f"{len({p['run'] for p in points})} runs (each run's {res['keep_log']} log-spaced kept steps), "
                   f"each at its training compute, scored on {tasks}NIAH (easy mode, the true one of 4 one-letter "
                   f"values ranked first; {res['trials']} trials per cell). The perplexities get a power law in "
                   "compute per architecture where a run has 3 checkpoints or more; accuracies are shown without "
                   "a fit."))
    b.append(("table", ["run", "arch", "step", "C (PFLOP/s-days)", *[MEASURES[m] for m in shown]],
              [[p["run"], p["arch"], str(p["step"]), f"{p['compute_pflops_days']:.3g}",
                *[fmt(p.get(m), ".3f") for m in shown]] for p in points]))
    fits = [[m, a, fmt(f["alpha"], ".4f"), f"{f['beta']:.4g}", str(f["n"])]
            for m, per in res["fits"].items() for a, f in per.items()]
    if fits:
        b.append(("table", ["measure", "arch", "alpha", "beta", "checkpoints"], fits))
    niah = [p for p in points if "niah_mean" in p and "niah_band" in p]
    if niah and not any(p["niah_mean"] > p["niah_band"] for p in niah):
        b.append(("p", f"NIAH is not measurable at this scale: no checkpoint is above chance (chance "
                       f"{fmt(niah[0].get('niah_chance'), '.3f')}; none beyond chance plus two binomial standard "
                       "errors), so it cannot order the architectures."))
    skipped = next((p["niah_skipped"] for p in points if "niah_skipped" in p), None)
    if skipped:
        b.append(("p", f"NIAH was not measured at some checkpoints: {skipped}."))
    for name in res["plots"]:
        img = image(job, name)
        if img:
            b.append(img)
    return b


def plan(p) -> str:
    k, s = p.scaling.keep_log, p.downstream
    if not k:
        return "downstream against compute: not in this recipe (scaling.keep_log is 0: no checkpoints kept)"
    items = "every item" if s.limit is None else f"at most {s.limit} items"
    return (f"downstream against compute: each scaling run's {k} log-spaced kept checkpoints on the commonsense "
            f"average, LAMBADA and WikiText-2 (with --data-dir, {items} per task) and NIAH (easy, choice, "
            f"{s.trials} trials per cell)")


SECTION = Section("downstream", run, 0.03, needs=("scaling",), settings=("overrides", "scaling_dir", "data_dir"),
                  render=render, report_rank=6, plots=("downstream_*",), trees=("downstream",), plan=plan,
                  key="downstream", options=DownstreamSettings)
