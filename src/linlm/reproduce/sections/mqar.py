"""The ``mqar`` section: the MQAR experiment (:mod:`linlm.experiments.mqar`) with the recipe's settings, in
DIR/mqar. A torchrun recipe trains its models only where --train-here is given (a GPU node)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Optional

from linlm.reproduce.section import Blocks, Section, Tick, fmt, heading, image


def measure(settings: dict, out: Path, plots: Path, tick: Tick) -> dict:
    """The MQAR experiment in ``out`` (a directory per run): a rerun reads the finished runs' results back and
    resumes a stopped run from its checkpoint. A run stopped by Ctrl-C or SIGTERM is not recorded; the stop (a
    KeyboardInterrupt) goes up to the job, which exits 130."""
    from linlm.eval.mqar import MQARConfig
    from linlm.experiments.mqar import default_runs, plot_experiment, run_experiment

    task = MQARConfig(**settings.get("task", {})).validate()
    kw = {"archs": tuple(settings["archs"])} if settings.get("archs") else {}
    runs = default_runs(tuple(settings.get("widths", (32, 64))), settings.get("experts", 4), **kw)
    train = {k: settings[k] for k in ("steps", "batch_size", "lr", "n_layers", "head_dim", "test_sequences")
             if k in settings}
    rows = run_experiment(runs, task, out, threads=1, what="--out", on_fraction=tick, **train)
    plot_experiment(rows, plots / "mqar.png", "--out")
    chance = 1.0 / max(1, task.vocab_size - 1 - task.num_keys)
    return {"task": asdict(task), "chance": chance, "settings": settings, "rows": rows, "plot": "mqar.png"}


def run(job, tick: Tick) -> Optional[dict]:
    p = job.recipe
    if p.mode == "torchrun" and not job.train_here:
        job.waiting["mqar"] = (f"recipe {p.name} trains MQAR's models on the cluster's GPUs, not here: run "
                               f"`linlm reproduce --recipe {p.name} --out {job.out} --train-here` on a GPU node")
        return None
    return measure(p.mqar, job.out / "mqar", job.plots, tick)


def render(job, pending: list[str]) -> Blocks:
    b, m = heading(job, "Retrieval: MQAR", pending, "mqar")
    if m is None:
        return b
    b.append(("p", f"Multi-query associative recall: {m['task']['num_kv']} key-value pairs, vocabulary "
                   f"{m['task']['vocab_size']}, chance {m['chance']:.3f}. Each model is trained on MQAR and tested "
                   "on held-out sequences. MossNet E1 vs E4: the same model with one or several SSM experts."))
    rows = [[r["name"], r["arch"], str(r["d_model"]), f"{r['active_params']:,}", f"{r['state_floats']:,}",
             fmt(r["final_loss"]), fmt(r["accuracy"], ".3f")] for r in m["rows"]]
    b.append(("table", ["model", "arch", "d", "active N", "state (floats)", "final loss", "accuracy"], rows))
    img = image(job, m["plot"])
    if img:
        b.append(img)
    return b


SECTION = Section("mqar", run, 0.14, render=render, report_rank=5, trees=("mqar",), plots=("mqar.png",),
                  plan=lambda p: f"MQAR: widths {p.mqar.get('widths')}, {p.mqar.get('steps')} steps per model")
