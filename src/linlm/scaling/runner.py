"""The sweep runner: every (architecture, rung) of a ladder trained through the Trainer API, resumably.

``DIR`` (``--out``) holds ``plan.json`` (the ladder and architectures it was started with), ``runs/<name>/`` (one
training run directory each, plus ``scaling.json``: see :mod:`linlm.scaling.runs`) and, for ``--emit torchrun``,
``configs/<name>.yaml``. A finished run is skipped; an interrupted one resumes from its newest checkpoint (the
Trainer restores the data order and RNG); the directory is locked against a second runner.

Everything the runner writes goes through :mod:`linlm.outputs`, so the directories and files are recorded as
linlm's. Before any work, and changing nothing, a directory is refused that is not a sweep of this ladder (another
ladder's, a user's training run, a user's files: :func:`check_sweep_dir`), that another live process trains in,
or that holds a run started with settings that change what it computes (:func:`check_started_runs`: a finished
run trained otherwise would be mixed into the fits without a word).

Loss is logged every optimizer step, i.e. at a fixed interval of ``batch_size x seq_len`` tokens; compute is
the library's count (:func:`linlm.models.counting.count`, the paper's convention) times the tokens seen.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from linlm import outputs
from linlm.errors import ConfigError, DataError
from linlm.locking import DirLock, check_unlocked
from linlm.scaling.fits import PFLOPS_DAY
from linlm.scaling.ladder import Ladder, PlannedRun, plan_runs
from linlm.scaling.runs import META_FILE, run_finished
from linlm.scaling.workers import run_pool, train_run

PLAN_FILE = "plan.json"
SWEEP_LOCK = "scaling directory"
MEASURE_MAX_PARAMS = 50_000_000  # above this, --dry-run does not time steps on this machine


# ---- data ----------------------------------------------------------------------------------------------------


@dataclass
class DataInfo:
    directory: Optional[Path]
    train_tokens: Optional[int]
    source_fingerprint: Optional[str]
    tokenizer_fingerprint: Optional[str]


def resolve_run_data(cfg, prepare: bool) -> DataInfo:
    """The prepared data of a run (prepared into the linlm cache when ``prepare``), with its token count."""
    from linlm.train.pipeline import prepared_data_dir, resolve_data

    if cfg.data.dir:
        directory = Path(cfg.data.dir).expanduser()
    else:
        try:
            directory = prepared_data_dir(cfg)
        except DataError:
            if prepare:
                raise
            return DataInfo(None, None, None, None)  # a plan may name a source this machine cannot reach
    if prepare and not cfg.data.dir:
        directory = resolve_data(cfg, show_progress=False)
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        if cfg.data.dir:
            raise DataError(f"data.dir: {directory} holds no prepared data (no meta.json); prepare it with "
                            "`linlm data prepare`")
        return DataInfo(None, None, None, None)
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    return DataInfo(directory, int(meta["splits"]["train"]["tokens"]), meta.get("source", {}).get("fingerprint"),
                    meta.get("tokenizer", {}).get("fingerprint"))


def run_meta(run: PlannedRun, ladder: Ladder, data: DataInfo) -> dict:
    cfg = run.config
    epochs = run.tokens / data.train_tokens if data.train_tokens else None
    return {"ladder": ladder.name, "arch": run.arch, "rung": run.rung, "params": run.params,
            "flops_per_token": run.flops_per_token, "head_flops_per_token": run.head_flops_per_token,
            "tokens_per_step": run.tokens_per_step, "log_interval_tokens": run.tokens_per_step,
            "steps": cfg.steps, "tokens": run.tokens, "compute_flops": run.compute,
            "compute_pflops_days": run.compute / PFLOPS_DAY,
            "data": {"source": cfg.data.source, "tokenizer": cfg.data.tokenizer,
                     "source_fingerprint": data.source_fingerprint, "tokenizer_fingerprint": data.tokenizer_fingerprint,
                     "train_tokens": data.train_tokens, "epochs": epochs}}


def check_epochs(runs: list[PlannedRun], infos: dict[str, DataInfo], ladder: Ladder) -> None:
    over = [(r, r.tokens / infos[r.name].train_tokens) for r in runs
            if infos[r.name].train_tokens and r.tokens / infos[r.name].train_tokens > ladder.max_epochs]
    if over:
        r, ep = max(over, key=lambda x: x[1])
        need = math.ceil(r.tokens / ladder.max_epochs)
        raise DataError(f"ladder {ladder.name}: {len(over)} run(s) would see their training data more than "
                        f"max_epochs={ladder.max_epochs:g} times (worst: {r.name}, {ep:.1f} epochs of "
                        f"{infos[r.name].train_tokens:,} tokens); use a corpus of at least {need:,} training tokens "
                        "(--set data.source=...), a smaller tokenizer (more tokens per text), or fewer tokens per rung")


# ---- estimates -----------------------------------------------------------------------------------------------


def measure_step_seconds(run: PlannedRun, vocab_size: int, steps: int = 2) -> float:
    """Seconds per optimizer step of ``run``'s model on this machine (random tokens, its batch shape, device,
    precision and threads); the fastest of ``steps`` timed steps after one warm-up step."""
    import torch

    from linlm.devices import resolve_device, resolve_precision
    from linlm.train.optim import build_optimizer
    from linlm.models.lm import CausalLM

    cfg = run.config
    model_cfg = cfg.model_config(vocab_size=vocab_size)
    old_threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        device = resolve_device(cfg.device)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        gen = torch.Generator().manual_seed(0)
        model = CausalLM(model_cfg).to(device)
        opt = build_optimizer(model, cfg.optim)  # the run's own optimizer, as the trainer builds it
        micro = max(1, cfg.batch_size // cfg.grad_accum)
        ids = torch.randint(0, model_cfg.vocab_size, (micro, cfg.data.seq_len), generator=gen).to(device)
        bf16 = resolve_precision(cfg.precision, device) == "bf16"
        best = math.inf
        for i in range(steps + 1):
            t0 = time.perf_counter()
            for _ in range(cfg.grad_accum):
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    loss = model(ids, targets=ids).loss
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            if i:
                best = min(best, time.perf_counter() - t0)
        return best
    finally:
        torch.set_num_threads(old_threads)


def vocab_guess(cfg, data: DataInfo) -> int:
    """The model's vocabulary: the override, the prepared tokenizer's, or the size a bpe:N spec asks for."""
    if "vocab_size" in cfg.model.overrides:
        return int(cfg.model.overrides["vocab_size"])
    if data.directory is not None:
        meta = json.loads((data.directory / "meta.json").read_text(encoding="utf-8"))
        return -(-int(meta["vocab_size"]) // 64) * 64
    tok = cfg.data.tokenizer
    if tok.startswith("bpe:") and tok[4:].isdigit():
        return -(-int(tok[4:]) // 64) * 64
    return 256


@dataclass
class PlanRow:
    run: PlannedRun
    data: DataInfo
    seconds: Optional[float]
    status: str


def _step_flops(row: PlanRow) -> float:
    r = row.run
    return float(r.tokens_per_step * (r.flops_per_token + r.head_flops_per_token))


def estimate(rows: list[PlanRow], flops_per_s: Optional[float], measure: bool,
             say: Callable[[str], None]) -> None:
    """Fill each row's estimated seconds: from ``flops_per_s`` (training FLOPs incl. the LM head), else from
    steps timed on this machine for models up to MEASURE_MAX_PARAMS. Per architecture, the smallest and the
    largest rung are timed and the rungs between are interpolated linearly in FLOPs per step (seconds per step =
    overhead + FLOPs / rate); an architecture with fewer than 3 rungs has every rung timed."""
    todo = [row for row in rows if row.status != "done"]
    for row in rows:
        if row.status == "done":
            row.seconds = 0.0
    if flops_per_s:
        from linlm.models.counting import count

        for row in todo:
            r = row.run
            c = count(r.config.model_config(vocab_size=vocab_guess(r.config, row.data)),
                      batch=r.config.batch_size, seq_len=r.config.data.seq_len)
            row.seconds = r.tokens * (c["flops_per_token"] + c["lm_head_flops_per_token"]) / flops_per_s
        return
    if not measure:
        return
    by_arch: dict[str, list[PlanRow]] = {}
    for row in todo:
        if row.run.params <= MEASURE_MAX_PARAMS:
            by_arch.setdefault(row.run.arch, []).append(row)
    for group in by_arch.values():
        group.sort(key=_step_flops)
        timed = [group[0], group[-1]] if len(group) >= 3 else group
        per_step = {}
        for row in timed:
            say(f"timing {row.run.name} ...")
            per_step[id(row)] = measure_step_seconds(row.run, vocab_guess(row.run.config, row.data))
        lo, hi = timed[0], timed[-1]
        for row in group:
            if id(row) in per_step:
                s = per_step[id(row)]
            else:
                f = (_step_flops(row) - _step_flops(lo)) / max(1.0, _step_flops(hi) - _step_flops(lo))
                s = per_step[id(lo)] + f * (per_step[id(hi)] - per_step[id(lo)])
            row.seconds = row.run.config.steps * s


# ---- the grid ------------------------------------------------------------------------------------------------


def _status(run: PlannedRun) -> str:
    out = Path(run.config.out_dir)
    if run_finished(out, run.config.steps):
        return "done"
    if (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir()):
        return "resume"
    return "todo"


# ---- the sweep directory -------------------------------------------------------------------------------------


def _read_plan(path: Path, what: str) -> dict:
    out = path.parent
    plan, why = outputs.read_own_json(path)
    if why == "not linlm's":
        raise ConfigError(f"{what} {out}: {path.name} there was not written by linlm (or was changed since), so this "
                          "is no sweep of `linlm scaling run`; choose another directory (nothing was written)")
    if plan is None:
        raise ConfigError(f"{what} {out}: {path} is unreadable (damaged); choose another directory (nothing was "
                          "written)")
    return plan


def check_sweep_dir(out: str | Path, ladder: Ladder, what: str = "--out", *, must_exist: bool = False,
                    probe_lock: bool = True) -> Path:
    """Refuse, before any work and changing nothing, a directory ``ladder``'s sweep may not train in; return it.

    Accepted: a new path (unless ``must_exist``: a directory given to be read must be there, so a mistyped one is
    refused instead of trained into), an empty directory, or a sweep of this ladder (its plan.json written by
    linlm). Refused: a file, a place that cannot be written, a directory of someone else's files, a directory
    that is no sweep (a training run of `linlm train`, say), another ladder's sweep, and (``probe_lock``) a sweep
    that another live process is training in."""
    out = outputs.check_dir(out, what)
    if not out.exists():
        if must_exist:
            raise ConfigError(f"{what} {out}: does not exist; give the --out directory of `linlm scaling run "
                              f"--ladder {ladder.name}`, or make an empty directory to start the sweep there "
                              "(nothing was written)")
        return out
    plan = out / PLAN_FILE
    if os.path.lexists(plan):
        old = _read_plan(plan, what)
        if old.get("ladder") != ladder.name:
            raise ConfigError(f"{what} {out}: holds a sweep of ladder {old.get('ladder')!r}, not {ladder.name!r}; "
                              "choose another directory (nothing was written)")
    else:
        other = [p.name for p in sorted(out.iterdir()) if not outputs.bookkeeping(p.name)]
        if other:
            raise ConfigError(f"{what} {out}: is no sweep of `linlm scaling run` (it has no plan.json, and holds "
                              f"{outputs.shown(other)}); give a sweep directory of ladder {ladder.name!r}, or a new "
                              "or empty directory (nothing was written)")
    if probe_lock:
        check_unlocked(out, f"{what} {SWEEP_LOCK}")
    return out


def in_the_way(parts: list[str]) -> bool:
    """Whether a path that is not linlm's, at ``parts`` relative to a sweep directory, is where a sweep writes:
    plan.json, or anything under runs/ or configs/ (a run directory belongs to its run alone, and whatever sits
    under runs/ is read as a run by the fits)."""
    return bool(parts) and parts[0] in (PLAN_FILE, "runs", "configs")


def check_started_runs(runs: list[PlannedRun], what: str = "--out") -> None:
    """Refuse a plan whose settings differ from those a run of it was started with, in a key that changes what
    the run computes (the Trainer's own rule for resuming). Without this a finished run trained with other
    settings would be skipped as done and mixed into the fits, and an unfinished one would fail half way
    through the grid. Changes nothing."""
    import yaml

    from linlm.train.train_config import config_diff, is_resumable_change
    from linlm.train.rundir import CONFIG_FILE

    for r in runs:
        path = Path(r.config.out_dir) / CONFIG_FILE
        try:
            saved = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError, UnicodeDecodeError, yaml.YAMLError):
            saved = None  # unreadable: the Trainer refuses it with the reason when the run resumes
        if not isinstance(saved, dict):
            continue
        differ = [k for k in config_diff(saved, r.config.to_dict()) if not is_resumable_change(k)]
        if differ:
            raise ConfigError(f"{what}: run {r.name} there was started with a different {', '.join(differ[:4])} "
                              f"(see {path}); these change what it computes. Give the settings the sweep was "
                              "started with (--set), or another directory (nothing was written)")


@contextlib.contextmanager
def locked_sweep(out: Path, ladder: Ladder, what: str) -> Iterator[None]:
    """Create ``out`` (as linlm's) and hold its lock; the directory is checked again under the lock (another
    runner may have written its plan in between). A directory made here for nothing is removed again."""
    created = outputs.make_dir(out, what)
    lock = DirLock(out, SWEEP_LOCK)
    try:
        lock.acquire()
        check_sweep_dir(out, ladder, what, probe_lock=False)
        yield
    finally:
        lock.release()
        outputs.remove_if_unused(created)


def _write_plan(out: Path, ladder: Ladder, archs: list[str], runs: list[PlannedRun], what: str) -> None:
    path = out / PLAN_FILE
    old = _read_plan(path, what) if path.is_file() else {}
    names = list(dict.fromkeys([*old.get("runs", []), *(r.name for r in runs)]))
    archs_all = list(dict.fromkeys([*old.get("archs", []), *archs]))
    outputs.write_json(path, {"ladder": ladder.name, "archs": archs_all, "runs": names}, what)


def fmt_seconds(s: Optional[float]) -> str:
    if s is None:
        return "n/a"
    from linlm.train.metrics import format_duration

    return format_duration(s)


def plan_table(rows: list[PlanRow]) -> tuple[list[str], list[list[str]]]:
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
    """The rows of a grid with their data resolved (prepared when ``prepare``). Too many epochs raise, or,
    when ``say`` is given (a plan that trains nothing), are reported through it."""
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
    try:
        check_epochs(runs, infos, ladder)
    except DataError as e:
        if say is None:
            raise
        say(f"warning: {e}")
    return [PlanRow(r, infos[r.name], None, _status(r)) for r in runs]


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


def emit_torchrun(ladder: Ladder, runs: list[PlannedRun], out: str | Path, what: str = "--out") -> list[str]:
    """Write each run's config to ``out/configs/<name>.yaml``, its scaling.json and the sweep's plan.json; return
    one torchrun command per run, grouped by rung. Each command resumes its run when run again (``--resume``
    starts fresh when the run directory is empty). The directory is checked first (:func:`check_sweep_dir`)."""
    out = Path(out).expanduser()
    check_sweep_dir(out, ladder, what)
    check_started_runs(runs, what)
    lines = []
    rung = None
    with locked_sweep(out, ladder, what):
        _write_plan(out, ladder, list(dict.fromkeys(r.arch for r in runs)), runs, what)
        for r in runs:
            if r.rung != rung:
                rung = r.rung
                lines.append(f"# rung {rung}")
            cfg_path = out / "configs" / f"{r.name}.yaml"
            outputs.write_text(cfg_path, r.config.to_yaml(), what)
            meta = run_meta(r, ladder, DataInfo(None, None, None, None))
            outputs.write_json(Path(r.config.out_dir) / META_FILE, meta, what)
            lines.append(f"torchrun {ladder.torchrun} -m linlm train --config {shlex.quote(str(cfg_path))} --resume")
    return lines


def fit_step_time(samples: list[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) of seconds per step = a + b x FLOPs per step, least squares over (FLOPs, seconds) samples, both >= 0.
    Until the samples span a factor of 2 in FLOPs per step (one size, or the same size of several architectures),
    the line would be noise, and so would a negative slope or intercept: then a = 0 and b is the mean rate."""
    xs = [x for x, _ in samples]
    n = len(samples)
    mx, ms = sum(xs) / n, sum(s for _, s in samples) / n
    rate = (0.0, ms / mx if mx > 0 else 0.0)
    if max(xs) < 2 * min(xs):
        return rate
    b = sum((x - mx) * (s - ms) for x, s in samples) / sum((x - mx) ** 2 for x in xs)
    if b <= 0:
        return ms, 0.0
    a = ms - b * mx
    return (a, b) if a >= 0 else rate


class GridProgress:
    """One display for the whole grid: runs done, compute done, and the time left.

    The time left: once runs have finished here, each step still to train is costed by a line fitted to their
    seconds per step against FLOPs per step (a tiny model spends most of a step on fixed costs, so compute alone
    overstates how long the rest takes); before that, by the FLOP rate so far. With ``jobs`` runs at once (each
    finished run's seconds measured while the others ran), the runs left are laid out on ``jobs`` workers in order."""

    def __init__(self, rows: list[PlanRow], live: bool, say: Callable[[str], None],
                 on_fraction: Optional[Callable[[float], None]] = None, jobs: int = 1):
        self.total = sum(self._work(r) for r in rows if r.status != "done")
        self.on_fraction = on_fraction
        self.done = 0.0
        self.t0 = time.perf_counter()
        self.say = say
        self.jobs = max(1, jobs)
        todo = [r for r in rows if r.status != "done"]
        self.work = {r.run.name: self._work(r) for r in todo}
        self.steps = {r.run.name: r.run.config.steps for r in todo}
        self.step_flops = {r.run.name: _step_flops(r) for r in todo}
        self.stepped = {name: 0 for name in self.steps}  # steps reported here, per run
        self.samples: list[tuple[float, float]] = []
        self.line: Optional[tuple[float, float]] = None
        self._left_at, self._left = -math.inf, ""
        self.bar = None
        if live:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("scaling"), BarColumn(), TextColumn("{task.percentage:>4.0f}% of compute"),
                                TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                TextColumn("{task.fields[left]}"),
                                console=Console(stderr=True))
            self.bar.start()
            self.task = self.bar.add_task("scaling", total=self.total or 1, info="", left="")

    @staticmethod
    def _work(row: PlanRow) -> float:
        r = row.run
        return float(r.tokens * (r.flops_per_token + r.head_flops_per_token))

    def eta(self) -> Optional[float]:
        if self.line is not None:
            a, b = self.line
            left = [(self.steps[name] - n) * (a + b * self.step_flops[name]) for name, n in self.stepped.items()]
            return wall_seconds([t for t in left if t > 0], self.jobs)
        if self.done <= 0:
            return None
        return (time.perf_counter() - self.t0) / self.done * (self.total - self.done)

    def step(self, name: str, info: str) -> None:
        """One optimizer step of run ``name``."""
        self.stepped[name] += 1
        self.advance(self.work[name] / self.steps[name], info)

    def finished(self, name: str, seconds: float) -> None:
        """Run ``name`` reached its end after ``seconds`` here: the steps it did not report (a resumed run's
        earlier ones) count now, and its seconds per step join the time-left line."""
        done_here = self.stepped[name]
        self.advance(self.work[name] * (1 - done_here / self.steps[name]), name)
        self.stepped[name] = self.steps[name]
        if done_here > 0 and seconds > 0:
            self.samples.append((self.step_flops[name], seconds / done_here))
            self.line = fit_step_time(self.samples)

    def advance(self, work: float, info: str) -> None:
        self.done += work
        if self.on_fraction is not None:
            self.on_fraction(min(1.0, self.done / self.total) if self.total else 1.0)
        if self.bar is not None:
            now = time.perf_counter()
            if now - self._left_at >= 1.0:  # the time left, recomputed once a second, not at every step
                left = self.eta()
                self._left_at, self._left = now, f"about {fmt_seconds(left)} left" if left is not None else ""
            self.bar.update(self.task, completed=self.done, info=info, left=self._left)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


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
    rows = prepare_rows(ladder, runs, prepare=True)
    with locked_sweep(out, ladder, what):
        _write_plan(out, ladder, archs, runs, what)
        todo = [r for r in rows if r.status != "done"]
        say(f"{ladder.name}: {len(rows)} runs ({len(rows) - len(todo)} already finished) in {out}")
        jobs = max(1, int(jobs or ladder.jobs))
        progress = GridProgress(rows, live, say, on_fraction, jobs=min(jobs, max(1, len(todo))))
        result = {"done": [r.run.name for r in rows if r.status == "done"], "trained": [], "interrupted": None}
        try:
            if jobs > 1 and len(todo) > 1:
                _run_parallel(todo, jobs, ladder, progress, say, result)
            else:
                _run_serial(todo, ladder, progress, say, result)
        finally:
            progress.close()
    return result


def wall_seconds(seconds: list[float], jobs: int) -> float:
    """The time to train runs of these durations, in this order, with ``jobs`` at once (each next run starts
    on the first free worker)."""
    free = [0.0] * max(1, jobs)
    for s in seconds:
        i = free.index(min(free))
        free[i] += s
    return max(free) if seconds else 0.0


def print_plan(rows: list[PlanRow], ladder: Ladder, *, timed: str, out=None) -> None:
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
