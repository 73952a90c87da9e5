"""The plan of a sweep: one row per run (its data, its status, its estimated time), the table ``linlm scaling
run --dry-run`` prints, and ``--emit torchrun``, which writes the runs' configs and one command per run instead
of training here.

Compute is C, the paper FLOPs per token (:mod:`linlm.models.cost`) times the tokens a run trains; a run's time
is estimated by :mod:`linlm.scaling.estimate`.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from linlm import outputs
from linlm.errors import DataError
from linlm.scaling.data import DataInfo, check_contexts, check_epochs, resolve_run_data, unknown_data
from linlm.scaling.fits import PFLOPS_DAY
from linlm.scaling.ladder import Ladder, PlannedRun
from linlm.scaling.progress import fmt_seconds, wall_seconds
from linlm.scaling.runs import META_FILE, run_finished, run_meta
from linlm.scaling.sweepdir import check_started_runs, check_sweep_dir, locked_sweep, write_plan


@dataclass
class PlanRow:
    run: PlannedRun
    data: DataInfo
    seconds: Optional[float]
    status: str  # "done", "resume" (checkpoints there) or "todo"


def run_status(run: PlannedRun) -> str:
    out = Path(run.config.out_dir)
    if run_finished(out, run.config.steps):
        return "done"
    if (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir()):
        return "resume"
    return "todo"


def plan_table(rows: list[PlanRow]) -> tuple[list[str], list[list[str]]]:
    """The plan as a table: its header and one row of text per run."""
    head = ["run", "N (non-emb.)", "tokens", "steps", "C (FLOPs)", "C (PFLOP/s-days)", "epochs", "est. time",
            "status"]
    body = []
    for row in rows:
        r = row.run
        ep = r.tokens / row.data.train_tokens if row.data.train_tokens else None
        body.append([r.name, f"{r.params:,}", f"{r.tokens:,}", f"{r.config.steps:,}", f"{r.compute:.3e}",
                     f"{r.compute / PFLOPS_DAY:.3e}", f"{ep:.2f}" if ep is not None else "?",
                     fmt_seconds(row.seconds), row.status])
    return head, body


def prepare_rows(ladder: Ladder, runs: list[PlannedRun], prepare: bool,
                 say: Optional[Callable[[str], None]] = None) -> list[PlanRow]:
    """The rows of a grid with their data resolved (prepared when ``prepare``). A context the data cannot fill
    raises; too many epochs raise, or, when ``say`` is given (a plan that trains nothing), are reported through it."""
    infos: dict[str, DataInfo] = {}
    cache: dict[str, DataInfo] = {}
    for r in runs:
        d = r.config.data
        key = json.dumps([d.source, d.tokenizer, d.val_fraction, d.dir])
        if key not in cache:
            cache[key] = resolve_run_data(r.config, prepare)
        infos[r.name] = cache[key]
        if infos[r.name].directory is not None and not r.config.data.dir:
            r.config.data.dir = str(infos[r.name].directory)
    check_contexts(runs, infos, ladder)
    try:
        check_epochs(runs, infos, ladder)
    except DataError as e:
        if say is None:
            raise
        say(f"warning: {e}")
    return [PlanRow(r, infos[r.name], None, run_status(r)) for r in runs]


def plan_rows(ladder: Ladder, runs: list[PlannedRun], say: Callable[[str], None], prepare: bool = True,
              strict_epochs: bool = True) -> list[PlanRow]:
    """The rows of a plan, with the data prepared (when ``prepare``) if this machine can read the source, for
    the epochs; a source it cannot reach leaves the epochs unknown. Too many epochs raise (``strict_epochs``)
    or are a warning."""
    warn = None if strict_epochs else say
    try:
        return prepare_rows(ladder, runs, prepare=prepare, say=warn)
    except DataError as e:
        if "max_epochs" in str(e):
            raise
        say(f"note: the data was not prepared, so epochs are unknown: {e}")
        return prepare_rows(ladder, runs, prepare=False, say=warn)


def emit_torchrun(ladder: Ladder, runs: list[PlannedRun], out: str | Path, what: str = "--out",
                  write: bool = True) -> list[str]:
    """Write each run's config to ``out/configs/<name>.yaml``, its scaling.json and the sweep's plan.json; return
    one torchrun command per run, grouped by rung. Each command resumes its run when run again (``--resume``
    starts fresh when the run directory is empty). The directory is checked first (:func:`check_sweep_dir`).
    ``write=False`` (``--dry-run``) makes the same checks and returns the same commands, and writes nothing."""
    out = Path(out).expanduser()
    check_sweep_dir(out, ladder, what)
    check_started_runs(runs, what)
    lines = []
    rung = None
    for r in runs:
        if r.rung != rung:
            rung = r.rung
            lines.append(f"# rung {rung}")
        cfg_path = out / "configs" / f"{r.name}.yaml"
        lines.append(f"torchrun {ladder.torchrun} -m linlm train --config {shlex.quote(str(cfg_path))} --resume")
    if write:
        with locked_sweep(out, ladder, what):
            write_plan(out, ladder, list(dict.fromkeys(r.arch for r in runs)), runs, what)
            for r in runs:
                outputs.write_text(out / "configs" / f"{r.name}.yaml", r.config.to_yaml(), what)
                outputs.write_json(Path(r.config.out_dir) / META_FILE, run_meta(r, ladder, unknown_data()), what)
    return lines


def check_runs_memory(runs: list[PlannedRun]) -> None:
    """Refuse (ResourceError naming the run) a sweep with a run whose training step cannot fit in this machine's
    memory, before any run of it trains (each run's Trainer checks again when it starts)."""
    from linlm.train.pipeline import check_training_memory

    for r in sorted(runs, key=lambda r: -r.step_flops):  # the largest first: its refusal is the one to read
        check_training_memory(r.config, where=f"run {r.name}: ")


def print_plan(rows: list[PlanRow], ladder: Ladder, *, timed: str, out=None) -> None:
    """Print the plan's table and its totals: compute, tokens, epochs and the estimated time (``timed`` says
    where the estimate comes from)."""
    out = out or sys.stdout
    head, body = plan_table(rows)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    print(f"ladder {ladder.name}: {len(rows)} runs", file=out)
    for line in [head, ["-" * w for w in widths], *body]:
        print("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(line, widths))),
              file=out)
    total_c = sum(r.run.compute for r in rows)
    secs = [r.seconds for r in rows if r.status != "done"]
    known = [s for s in secs if s is not None]
    wall = wall_seconds(known, ladder.jobs)
    total_t = fmt_seconds(wall) if known and len(known) == len(secs) else (
        f"at least {fmt_seconds(wall)} (some runs not estimated)" if known else "n/a")
    if known and ladder.jobs > 1:
        total_t += f" with {ladder.jobs} runs at once, each as fast as alone ({fmt_seconds(sum(known))} one by one)"
    max_ep = [r.run.tokens / r.data.train_tokens for r in rows if r.data.train_tokens]
    print(f"total compute {total_c:.3e} FLOPs = {total_c / PFLOPS_DAY:.3e} PFLOP/s-days; "
          f"{sum(r.run.tokens for r in rows):,} tokens; max epochs "
          f"{max(max_ep):.2f} (limit {ladder.max_epochs:g})" if max_ep else
          f"total compute {total_c:.3e} FLOPs = {total_c / PFLOPS_DAY:.3e} PFLOP/s-days; epochs unknown until the "
          "data is prepared", file=out)
    print(f"estimated time: {total_t} ({timed}; evaluation and checkpoints not included)", file=out)
