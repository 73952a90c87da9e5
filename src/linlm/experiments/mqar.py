"""The MQAR experiment (``linlm mqar``): small models of every architecture trained on the same MQAR stream, each
measured on held-out sequences, accuracy against the width and the decoding state's size (floats per sequence,
``ModelState.tensors``), with several seeds per configuration. MossNet runs as a grid of E SSM experts x routing
policies against Mamba and LLaMA sized to it at equal active parameters and at equal state size, the direct test
of MossNet's multi-head argument. The runs are :mod:`linlm.experiments.mqar_grid`, their summary and comparison
groups :mod:`linlm.experiments.mqar_summary`; the task itself (generator, stream, accuracy) is
:mod:`linlm.eval.mqar`.

It is resumable run by run, and a result is recorded only for a run that trained to its end: a stop (Ctrl-C)
leaves the stopped run's checkpoint and no result, and the same call again resumes it. A run may train to a
plateau instead of a fixed count of steps, and each configuration at its own learning rate from a sweep
(:mod:`linlm.experiments.mqar_plateau`).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from linlm import outputs
from linlm.errors import ConfigError
from linlm.eval.mqar import MQARConfig, mqar_accuracy, mqar_data, mqar_test_set, state_floats
from linlm.experiments.mqar_grid import MQARRun, default_archs, default_runs, model_overrides
from linlm.experiments.mqar_plateau import Plateau, at_chance, choose_lr, copying, learning_loss
from linlm.experiments.mqar_summary import loss_trend
from linlm.locking import DirLock

if TYPE_CHECKING:
    from linlm.train import TrainConfig

__all__ = ["MQARRun", "Plateau", "RECORD_FILE", "default_archs", "default_runs", "plot_experiment", "run_experiment",
           "sweep_learning_rates"]

log = logging.getLogger("linlm.experiments.mqar")

RECORD_FILE = "mqar.json"  # in each run's directory: its settings, and its result once the run has finished


@dataclass
class _Planned:
    """A run of the experiment, decided before anything is trained or written."""

    run: MQARRun
    train_cfg: "TrainConfig"
    model_over: dict
    settings: dict  # what its result depends on; recorded in RECORD_FILE and compared on a rerun
    row: Optional[dict]  # its result, when it finished earlier with these settings (read back, not recomputed)
    has_run: bool  # its directory holds a training run (the Trainer's files)
    replace: bool  # ... which is not this run's to resume: the Trainer replaces it once this run starts
    new_record: bool  # record these settings (and no result) before anything trains

    @property
    def dir(self) -> Path:
        return Path(self.train_cfg.out_dir)

    def record(self, result: Optional[dict] = None, replace: Optional[bool] = None) -> dict:
        return {"settings": self.settings, "result": result,
                "replace": self.replace if replace is None else replace}


def _plan_run(run: MQARRun, cfg: MQARConfig, out_dir: Path, train: dict, test_sequences: int, overwrite: bool,
              what: str, plateau: Optional[Plateau] = None) -> _Planned:
    """Build the run's TrainConfig and decide what to do with its directory; writes nothing.

    A directory holding this run with the same settings continues it: its result is read back when it finished,
    else its training resumes from the checkpoint. One holding another experiment's run (other settings, or a
    training run with no record of this experiment) is refused unless ``overwrite``, which replaces it."""
    from linlm.train import build_config
    from linlm.train.train_config import config_diff
    from linlm.train.rundir import RunDir

    # A run to a plateau trains at a constant rate after its warmup, in blocks (its config's steps: the first).
    steps = plateau.min_steps if plateau else train["steps"]
    model_over = model_overrides(run, train["n_layers"], train["head_dim"], cfg.vocab_size, cfg.seq_len)
    run_dir = out_dir / run.dir_name()
    schedule = {"kind": "constant" if plateau else "cosine", "warmup_steps": min(50, steps // 10)}
    train_cfg = build_config(None, {
        "model": {"arch": run.arch, "preset": None, "overrides": model_over},
        "out_dir": str(run_dir), "steps": steps, "batch_size": train["batch_size"], "seed": run.seed,
        "optim": {"lr": run.lr or train["lr"], "weight_decay": 0.1}, "schedule": schedule,
        "eval": {"every": steps, "batches": 2},
        "checkpoint": {"every": plateau.block if plateau else steps, "keep": 1},
        "data": {"seq_len": cfg.seq_len}, "samples": {"prompts": []},
        "log_every": 10 if plateau else max(1, steps // 5), "threads": train["threads"],
    })
    # Where the run lives and how many threads train it do not change what it computes.
    trained = {k: v for k, v in train_cfg.to_dict().items() if k not in ("out_dir", "threads")}
    settings = json.loads(json.dumps({"task": asdict(cfg), "test_sequences": test_sequences, "train": trained,
                                      **({"plateau": asdict(plateau)} if plateau else {})}))
    outputs.check_dir(run_dir, what, names=[RECORD_FILE])
    record = _read_record(run_dir / RECORD_FILE, what)
    has_run = RunDir(run_dir).has_run()
    again = "pass --overwrite to train it again with these settings, or choose another directory"
    if record is None and has_run and not overwrite:
        raise ConfigError(f"{what} {out_dir}: {run_dir} holds a training run that no MQAR experiment recorded (it "
                          f"has no {RECORD_FILE}); {again}")
    if record is not None and record["settings"] != settings and not overwrite:
        differ = config_diff(record["settings"], settings)
        raise ConfigError(f"{what} {out_dir}: {run_dir} holds {run.name()} of another experiment (its settings "
                          f"differ at {outputs.shown(differ, 6)}); {again}")
    if record is None or overwrite:
        return _Planned(run, train_cfg, model_over, settings, None, has_run, replace=has_run, new_record=True)
    # This run, started before: finished (read back), or to resume, or still to replace an older run (a stopped
    # --overwrite: its run directory still holds what it replaces).
    return _Planned(run, train_cfg, model_over, settings, record.get("result"), has_run,
                    replace=bool(record.get("replace")) and has_run, new_record=False)


def _read_record(path: Path, what: str) -> Optional[dict]:
    """A run's record ({"settings", "result": row or None, "replace"}), or None when there is none."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what} {path}: unreadable ({e}); linlm wrote it, so it was damaged since. Pass "
                          "--overwrite to train that run again, or choose another directory") from None
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        raise ConfigError(f"{what} {path}: not a record of an MQAR run; pass --overwrite to train that run again, "
                          "or choose another directory")
    return record


# The peak learning rate of a run not given one (`linlm mqar --lr`). Width 64, 2 layers, 4 pairs, 3,000 cosine
# steps, one seed (AVX2 EPYC): LLaMA 1.000 at 1e-3, 0.518 at 3e-3, 0.449 at 1e-2; HGRN2 0.539 / 0.523 / 0.065; TNL
# 0.500 / 0.490; Mamba-2 0.537 / 0.524. Faster rates settle on copying a context value.
DEFAULT_LR = 1e-3


def run_experiment(runs: list[MQARRun], cfg: MQARConfig, out_dir, *, steps: int = 300, batch_size: int = 32,
                   lr: float = DEFAULT_LR, n_layers: int = 2, head_dim: int = 16, test_sequences: int = 512,
                   threads: int = 0, overwrite: bool = False, what: str = "out_dir",
                   on_fraction: Optional[Callable[[float], None]] = None,
                   plateau: Optional[Plateau] = None, jobs: int = 1) -> list[dict]:
    """Train each run on MQAR with the Trainer (``out_dir/NAME-sSEED``) and measure its test accuracy; one row per
    run (a configuration and a seed: :func:`linlm.experiments.mqar_summary.summarize` joins a configuration's
    seeds). A run's seed sets its initialisation, its training stream and its held-out test set.

    Resumable, one run at a time. Every run's directory is checked before anything is trained or written (see
    :func:`_plan_run`; ``what`` names the directory in messages, e.g. ``--out``), then each run's settings are
    recorded in ``out_dir/NAME-sSEED/mqar.json``; ``out_dir`` is locked while the experiment runs. A run's result joins
    its record only once its training has reached ``steps``, and a rerun with the same settings reads it back
    instead of measuring again; a stopped run resumes from its checkpoint. A run the Trainer stopped on SIGINT /
    SIGTERM is neither measured nor recorded, and no later run is trained: this raises
    :class:`linlm.signals.Stopped` (a KeyboardInterrupt). ``overwrite`` trains every run again from step 0: their
    old results are dropped at once, and the Trainer replaces each old run (removing only what linlm wrote) when
    the new one starts, also when a rerun without ``overwrite`` continues a stopped one. ``threads`` 0 leaves
    torch's thread count as it is (TrainConfig.threads). ``on_fraction(f)`` hears the fraction of runs done.
    ``plateau``: each run trains to a plateau by that rule instead of ``steps`` (its row says whether it got there);
    a run's own ``lr`` replaces ``lr``. ``jobs`` > 1 trains that many runs at once, each in a worker process
    (:mod:`linlm.train.workers`) with ``threads`` threads: the same rows, as each run's seed alone sets what it
    computes; a stop checkpoints every running run, records none of them, and raises Stopped once all have
    stopped."""
    cfg = cfg.validate()
    out_dir = Path(out_dir).expanduser()
    names = [r.dir_name() for r in runs]
    if not names:
        raise ConfigError("mqar: no runs to train; give at least one architecture (or MossNet experts)")
    twice = sorted(n for n, k in Counter(names).items() if k > 1)  # linear: a grid may hold many thousand runs
    if twice:
        raise ConfigError(f"mqar: runs {', '.join(twice)} are given twice (a width, architecture or seed "
                          "repeated?); give each once")
    train = {"steps": steps, "batch_size": batch_size, "lr": lr, "n_layers": n_layers, "head_dim": head_dim,
             "threads": threads}
    tests = {s: mqar_test_set(cfg, test_sequences, s) for s in dict.fromkeys(r.seed for r in runs)}

    def plan() -> list[_Planned]:
        return [_plan_run(r, cfg, out_dir, train, test_sequences, overwrite, what, plateau) for r in runs]

    plan()  # every refusal before anything is created
    outputs.make_dir(out_dir, what)
    rows = []
    with DirLock(out_dir, what):
        plans = plan()  # again under the lock: another experiment may have changed a run since
        for p in plans:
            if p.new_record:
                outputs.write_json(p.dir / RECORD_FILE, p.record(), what)
        if jobs > 1 and sum(p.row is None for p in plans) > 1:
            return _in_workers(plans, cfg, tests, what, plateau, jobs, on_fraction)
        for i, p in enumerate(plans, 1):
            if p.row is not None:
                _read_back(p, f"[{i}/{len(plans)}]")
                rows.append(p.row)
            else:
                rows.append(_train_and_measure(p, cfg, tests[p.run.seed], what, f"[{i}/{len(plans)}]", plateau))
            if on_fraction is not None:
                on_fraction(i / len(plans))
    return rows


@dataclass
class _InWorker:
    """One run trained and measured in a worker process (:func:`linlm.train.workers.run_pool`)."""

    plan: _Planned
    cfg: MQARConfig
    test: list
    what: str
    prefix: str
    plateau: Optional[Plateau]

    def run_in_worker(self, on_step: Callable[[dict], None]) -> dict:
        return _train_and_measure(self.plan, self.cfg, self.test, self.what, self.prefix, self.plateau, on_step)


def _in_workers(plans: list[_Planned], cfg: MQARConfig, tests: dict, what: str, plateau: Optional[Plateau],
                jobs: int, on_fraction: Optional[Callable[[float], None]]) -> list[dict]:
    """The runs still to train, ``jobs`` at a time in worker processes; the rows in the plans' order."""
    from linlm.train.workers import run_pool
    from linlm.signals import Stopped

    n, rows = len(plans), {p.run.dir_name(): p.row for p in plans if p.row is not None}
    for i, p in enumerate(plans, 1):
        if p.row is not None:
            _read_back(p, f"[{i}/{n}]")
    if on_fraction is not None and rows:
        on_fraction(len(rows) / n)
    work = [(p.run.dir_name(), _InWorker(p, cfg, tests[p.run.seed], what, f"[{i}/{n}]", plateau))
            for i, p in enumerate(plans, 1) if p.row is None]
    log.info("training %d runs, %d at a time, each in its own process", len(work), jobs)

    def done(key: str, payload: dict) -> None:
        row = payload.get("result")
        if row is None:  # stopped: checkpointed, not recorded
            return
        rows[key] = row
        log.info("%s: %s after %d steps", key, "diverged" if row.get("diverged") else
                 f"accuracy {_shown(row.get('accuracy'))}", row["steps"])
        if on_fraction is not None:
            on_fraction(len(rows) / n)

    stopped = run_pool(work, jobs, on_start=lambda key: log.info("%s: training", key),
                       on_step=lambda key, loss: None, on_done=done)
    if stopped:
        left = [p.run.dir_name() for p in plans if p.run.dir_name() not in rows]
        raise Stopped(stopped, f"stopped by {stopped}: {len(left)} run(s) not finished ({', '.join(left[:4])}"
                               f"{', ...' if len(left) > 4 else ''}), each running one checkpointed; run the same "
                               "command again to resume")
    return [rows[p.run.dir_name()] for p in plans]


def _read_back(plan: _Planned, prefix: str) -> None:
    log.info("%s %s: finished earlier (%d steps, accuracy %s); read back", prefix, plan.run.dir_name(),
             plan.row["steps"], _shown(plan.row.get("accuracy")))


def _shown(accuracy: Optional[float]) -> str:
    return "none: diverged" if accuracy is None else f"{accuracy:.3f}"


def _hooks(plan: _Planned, prefix: str, what: str, on_step: Optional[Callable[[dict], None]] = None):
    """TrainHooks for one run: say whether it starts or resumes, and at which step; once the Trainer has replaced
    an older run in its directory, record that it did; pass each step's record to ``on_step``."""
    from linlm.train import TrainHooks

    name = plan.run.dir_name()

    class Hooks(TrainHooks):
        def on_step(self, record: dict) -> None:
            if on_step is not None:
                on_step(record)

        def on_start(self, info: dict) -> None:
            if plan.replace:
                outputs.write_json(plan.dir / RECORD_FILE, plan.record(replace=False), what)
            if info["start_step"]:
                log.info("%s %s: resuming at step %d of %d", prefix, name, info["start_step"], info["steps"])
            else:
                log.info("%s %s: training %d steps", prefix, name, info["steps"])

    return Hooks()


def _train_and_measure(plan: _Planned, cfg: MQARConfig, test: list, what: str, prefix: str,
                       plateau: Optional[Plateau] = None, on_step: Optional[Callable[[dict], None]] = None) -> dict:
    """Train (or resume) one run to its end, measure it and record its row; a stopped run raises Stopped.

    A run the divergence guard stopped is a result too: its row says why (``diverged``), its accuracy is None and
    it is recorded, so that the experiment goes on and a rerun reads it back instead of diverging again. With
    ``plateau`` the run is continued block by block until the rule says it plateaued, it stops still at chance
    (the rule's chance_steps) or it reaches max_steps."""
    import dataclasses

    from linlm.models.io import load
    from linlm.errors import TrainingDiverged
    from linlm.models.counting import count
    from linlm.models.lm import CausalLM
    from linlm.models.presets import preset_config
    from linlm.signals import Stopped
    from linlm.train import Trainer
    from linlm.train.metrics import METRICS_FILE, read_metrics

    name, steps, seed = plan.run.dir_name(), plan.train_cfg.steps, plan.run.seed
    resume, train_cfg, flat = plan.has_run and not plan.replace, plan.train_cfg, None
    while True:
        trainer = Trainer(train_cfg, resume=resume, overwrite=plan.replace and not resume,
                          hooks=_hooks(plan, prefix, what, on_step), verbose=False, live=False, data=mqar_data(cfg, seed=seed))
        try:
            result, diverged = trainer.run(), None
        except TrainingDiverged as e:
            result, diverged = None, str(e)
        if result is not None and result.interrupted:
            raise Stopped(result.interrupted, f"stopped by {result.interrupted}: {name} at step {result.step} of "
                                              f"{train_cfg.steps} (checkpoint {result.checkpoint})")
        if result is not None and (not result.finished or result.step < train_cfg.steps):
            raise RuntimeError(f"{name}: the Trainer returned at step {result.step} of {train_cfg.steps} without a "
                               "stop signal")
        if plateau is None or result is None:
            break
        records = read_metrics(plan.dir / METRICS_FILE)
        flat = plateau.plateaued(records, cfg.chance, cfg.copy_loss)
        if flat or result.step >= plateau.max_steps or plateau.gives_up(records, cfg.chance):
            flat = bool(flat)
            break
        resume, steps = True, plateau.next_steps(result.step)
        train_cfg = dataclasses.replace(train_cfg, steps=steps)
    config = preset_config(plan.run.arch, None, **plan.model_over)
    counts = count(config, batch=1, seq_len=cfg.seq_len)
    # The steps' own time, from the metrics log: a resumed run counts each step once, whichever call trained it.
    metrics = read_metrics(plan.dir / METRICS_FILE)
    seconds = sum(r.get("step_s") or 0.0 for r in metrics)
    model = CausalLM(config) if result is None else load(result.checkpoint)  # the state's size: any weights
    layers, state = plan.model_over["n_layers"], state_floats(model, cfg.seq_len)
    measured = ({"accuracy": None, "sequence_accuracy": None, "answers": 0} if result is None
                else mqar_accuracy(model, test))
    row = {"name": plan.run.name(), "run": name, "seed": seed, "arch": plan.run.arch, "d_model": plan.run.d_model,
           "n_layers": layers, "overrides": plan.run.overrides or {}, "params": counts["non_embedding_params"],
           "active_params": counts["active_non_embedding_params"], "state_floats": state,
           "state_per_layer": state / layers, "steps": result.step if result else (metrics or [{}])[-1].get("step", 0),
           "final_loss": result.loss if result else (metrics or [{}])[-1].get("loss"), "diverged": diverged,
           **loss_trend([r.get("loss") for r in metrics]), "seconds": seconds, "lr": plan.train_cfg.optim.lr,
           "plateaued": flat, "study": plan.run.study or {}, **measured}
    margin, loss = (plateau or Plateau()).chance_margin, learning_loss(metrics)
    row["at_chance"] = at_chance(loss, cfg.chance, margin)
    row["copying"] = not row["at_chance"] and copying(loss, cfg.copy_loss, margin)
    outputs.write_json(plan.dir / RECORD_FILE, plan.record(row, replace=False), what)
    if diverged:
        log.warning("%s %s: diverged (%s); recorded without an accuracy", prefix, name, diverged)
    else:
        log.info("%s %s: accuracy %.3f after %d steps", prefix, name, row["accuracy"], row["steps"])
    return row


def sweep_learning_rates(configs: list[MQARRun], lrs, cfg: MQARConfig, out_dir, *, steps: int,
                         on_fraction: Optional[Callable[[float], None]] = None, **train) -> dict[str, dict]:
    """Each configuration (seed 0) trained ``steps`` (an even number) at each of ``lrs``, at the constant rate the
    plateau runs train at, in ``out_dir`` (resumable as the experiment is); returns {configuration: {"losses":
    {lr: loss}, "chosen": lr}} (:func:`choose_lr`)."""
    runs = [MQARRun(c.arch, c.d_model, f"{c.name()}-lr{lr:g}", c.overrides, 0, lr, c.study)
            for c in configs for lr in lrs]
    fixed = Plateau(block=steps // 2, min_steps=steps, max_steps=steps).validate()
    rows = run_experiment(runs, cfg, out_dir, on_fraction=on_fraction, plateau=fixed, **train)
    by = {r.name(): [] for r in configs}
    for run, row in zip(runs, rows):
        by[run.name().rsplit("-lr", 1)[0]].append(row)
    return {name: choose_lr(found) for name, found in by.items()}


def plot_experiment(configs: list[dict], path, what: Optional[str] = None) -> Path:
    """Accuracy against the state per layer (left) and against the active non-embedding parameters (right): the
    two sizes the comparison groups hold equal. One line per configuration family (the name without its width)
    through its widths, the seeds' mean with their min-max as error bars where a row has them
    (:func:`linlm.experiments.mqar_summary.summarize`'s rows, or single runs), written to the PNG ``path`` through
    linlm.outputs (a Figure of its own: pyplot's global state is not used)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, 2)
    configs = [r for r in configs if r["accuracy"] is not None]  # a configuration whose every seed diverged
    labels = list(dict.fromkeys(r["name"].rsplit("-d", 1)[0] for r in configs))
    colours = colormaps["tab20"]
    for i, label in enumerate(labels):
        pts = sorted((r for r in configs if r["name"].rsplit("-d", 1)[0] == label), key=lambda r: r["d_model"])
        acc = [r["accuracy"] for r in pts]
        err = [[a - r.get("accuracy_min", a) for a, r in zip(acc, pts)],
               [r.get("accuracy_max", a) - a for a, r in zip(acc, pts)]]
        state = [r.get("state_per_layer", r["state_floats"] / r["n_layers"]) for r in pts]
        style = {"yerr": err, "fmt": "o-", "capsize": 2, "label": label, "color": colours(i % 20)}
        axes[0].errorbar(state, acc, **style)
        axes[1].errorbar([r["active_params"] for r in pts], acc, **style)
    axes[0].set_xlabel("decoding state per layer (floats per sequence)")
    axes[1].set_xlabel("active non-embedding parameters")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_ylabel("MQAR accuracy (mean, min-max over seeds)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return outputs.save_figure(fig, path, what)
