"""The sweep runner: every (architecture, rung) of a ladder trained through the Trainer API, resumably.

``DIR`` (``--out``) holds ``plan.json`` (the ladder and architectures it was started with) and ``runs/<name>/``
(one training run directory each, plus ``scaling.json``: see :mod:`linlm.scaling.runs`). A finished run is
skipped; an interrupted one resumes from its newest checkpoint (the Trainer restores the data order and RNG); the
directory is checked before any work and locked against a second runner (:mod:`linlm.scaling.sweepdir`). Runs
train one by one in this process, or ``jobs`` at a time in worker processes (:mod:`linlm.train.workers`).

Loss is logged every optimizer step, i.e. at a fixed interval of ``batch_size x seq_len`` tokens; compute is
C, the paper FLOPs per token (:mod:`linlm.models.cost`) times the tokens seen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from linlm import outputs
from linlm.scaling.ladder import Ladder, plan_runs
from linlm.scaling.plan import PlanRow, check_runs_memory, prepare_rows
from linlm.scaling.progress import GridProgress, fmt_seconds
from linlm.scaling.runs import META_FILE, run_meta
from linlm.scaling.sweepdir import check_started_runs, check_sweep_dir, locked_sweep, write_plan
from linlm.train.workers import run_pool, train_run


def _begin(row: PlanRow, ladder: Ladder) -> None:
    """The run's directory (made as linlm's, with runs/) and its scaling.json, before the Trainer opens it."""
    outputs.write_json(Path(row.run.config.out_dir) / META_FILE, run_meta(row.run, ladder, row.data))


def _started(i: int, n: int, row: PlanRow, progress: GridProgress) -> str:
    r, left = row.run, progress.eta()
    return (f"[{i}/{n}] {'resuming' if row.status == 'resume' else 'training'} {r.name}: N={r.params:,}, "
            f"{r.tokens:,} tokens, {r.config.steps} steps"
            + (f"; about {fmt_seconds(left)} left in the grid" if left else ""))


def _finished(name: str, loss: Optional[float], seconds: float) -> str:
    return f"    {name}: loss {loss:.4f} after {fmt_seconds(seconds)}" if loss is not None else f"    {name}: done"


def _run_serial(todo: list[PlanRow], ladder: Ladder, progress: GridProgress, say: Callable[[str], None],
                result: dict) -> None:
    for i, row in enumerate(todo, 1):
        r = row.run
        _begin(row, ladder)

        def on_step(rec: dict, _r=r, _i=i) -> None:
            loss = rec.get("loss")
            progress.step(_r.name, f"{_r.name} ({_i}/{len(todo)}) loss {loss:.3f}" if loss is not None else _r.name)

        say(_started(i, len(todo), row, progress))
        res = train_run(r.config, on_step)
        if res.interrupted:
            result["interrupted"] = r.name
            say(f"stopped by {res.interrupted} during {r.name}; run the same command again to resume")
            return
        progress.finished(r.name, res.seconds)
        result["trained"].append(r.name)
        say(_finished(r.name, res.loss, res.seconds))


def _run_parallel(todo: list[PlanRow], jobs: int, ladder: Ladder, progress: GridProgress,
                  say: Callable[[str], None], result: dict) -> None:
    rows = {row.run.name: row for row in todo}
    order = {name: i for i, name in enumerate(rows, 1)}
    running: list[str] = []
    say(f"training {jobs} runs at a time, each in its own process")

    def on_start(name: str) -> None:
        _begin(rows[name], ladder)
        running.append(name)
        say(_started(order[name], len(todo), rows[name], progress))

    def on_step(name: str, loss: Optional[float]) -> None:
        progress.step(name, f"{', '.join(running)} ({len(result['trained'])}/{len(todo)} done)"
                            + (f" {name} loss {loss:.3f}" if loss is not None else ""))

    def on_done(name: str, res: dict) -> None:
        running.remove(name)
        if res.get("interrupted"):
            result["interrupted"] = result["interrupted"] or name
            say(f"stopped by {res['interrupted']} during {name}; run the same command again to resume")
            return
        progress.finished(name, res.get("seconds") or 0.0)
        result["trained"].append(name)
        say(_finished(name, res.get("loss"), res.get("seconds") or 0.0))

    stopped = run_pool([(name, row.run.config) for name, row in rows.items()], jobs,
                       on_start=on_start, on_step=on_step, on_done=on_done)
    if stopped and not result["interrupted"]:
        result["interrupted"] = running[0] if running else stopped
        say(f"stopped by {stopped}; run the same command again to resume")


def run_grid(ladder: Ladder, archs: Optional[list[str]], out: str | Path, *, overrides: Optional[dict] = None,
             live: bool = False, say: Callable[[str], None] = print,
             on_fraction: Optional[Callable[[float], None]] = None, jobs: Optional[int] = None,
             what: str = "--out") -> dict:
    """Train every run of the grid not yet finished; returns {"done": [...], "trained": [...], "interrupted": name}.
    ``on_fraction(f)`` hears the fraction of the grid's remaining compute done so far, after every step.
    ``jobs`` runs train at once, each in a worker process (default: the ladder's ``jobs``, 1 = in this process).
    ``what`` names the directory in errors (the flag that gave it).

    Every check that can refuse runs before anything is written into ``out``: the directory, the runs already
    started there, and the data (prepared into the linlm cache, never into ``out``)."""
    out = Path(out).expanduser()
    runs = plan_runs(ladder, archs, out, overrides)
    archs = list(dict.fromkeys(r.arch for r in runs))
    check_sweep_dir(out, ladder, what)
    check_started_runs(runs, what)
    check_runs_memory(runs)
    rows = prepare_rows(ladder, runs, prepare=True)
    with locked_sweep(out, ladder, what):
        write_plan(out, ladder, archs, runs, what)
        todo = [r for r in rows if r.status != "done"]
        say(f"{ladder.name}: {len(rows)} runs ({len(rows) - len(todo)} already finished) in {out}")
        jobs = max(1, int(jobs or ladder.jobs))
        progress = GridProgress([r.run for r in todo], live, say, on_fraction, jobs=min(jobs, max(1, len(todo))))
        result = {"done": [r.run.name for r in rows if r.status == "done"], "trained": [], "interrupted": None}
        try:
            if jobs > 1 and len(todo) > 1:
                _run_parallel(todo, jobs, ladder, progress, say, result)
            else:
                _run_serial(todo, ladder, progress, say, result)
        finally:
            progress.close()
    return result
