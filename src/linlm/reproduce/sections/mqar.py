"""The ``mqar`` section: the MQAR experiment (:mod:`linlm.experiments.mqar`) with the recipe's settings, in
DIR/mqar. A torchrun recipe trains its models only where --train-here is given (a GPU node).

Settings (the recipe's ``mqar:``): ``task`` (MQARConfig fields), ``widths``, ``archs``, ``experts`` (MossNet's SSM
expert counts, a list; [] or 0: no MossNet runs), ``policies`` (``routed-kN``, ``dense``, ``dense-kN``),
``matched`` (the baselines sized to MossNet, default true), ``seeds`` (a count >= 1, from ``seed``, default 0),
``steps``, ``batch_size``, ``lr``, ``n_layers``, ``head_dim``, ``test_sequences``. The result's ``rows`` are the
configurations (accuracy: the seeds' mean, with their min and max), ``runs`` every seed's row and ``groups`` the
comparisons at equal active parameters and at equal state size (:mod:`linlm.experiments.mqar_summary`).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Optional

from linlm.reproduce.section import Blocks, Section, Tick, heading, image


def run_settings(settings: dict) -> dict:
    """The experiment's runs and training options from the recipe's ``mqar:`` settings; a seed count below 1 and
    the other bad values are refused here, before any training."""
    from linlm.errors import ConfigError
    from linlm.eval.mqar import MQARConfig
    from linlm.experiments.mqar import default_runs
    from linlm.experiments.mqar_grid import DEFAULT_EXPERTS, DEFAULT_POLICIES

    task = MQARConfig(**settings.get("task", {})).validate()
    seeds, first = settings.get("seeds", 1), settings.get("seed", 0)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ConfigError(f"mqar seeds: {seeds!r}; give a count of seeds >= 1 (e.g. seeds: 3)")
    experts = settings.get("experts", list(DEFAULT_EXPERTS))
    experts = ([experts] if experts else []) if isinstance(experts, int) else list(experts)
    train = {k: settings[k] for k in ("steps", "batch_size", "lr", "n_layers", "head_dim", "test_sequences")
             if k in settings}
    shape = {"n_layers": train.get("n_layers", 2), "head_dim": train.get("head_dim", 16),
             "vocab_size": task.vocab_size, "seq_len": task.seq_len}
    kw = {"archs": tuple(settings["archs"])} if settings.get("archs") else {}
    runs = default_runs(tuple(settings.get("widths", (32, 64))), experts,
                        policies=tuple(settings.get("policies", DEFAULT_POLICIES)), seeds=range(first, first + seeds),
                        matched=settings.get("matched", True), **shape, **kw)
    return {"task": task, "runs": runs, "train": train, "seeds": list(range(first, first + seeds))}


def measure(settings: dict, out: Path, plots: Path, tick: Tick) -> dict:
    """The MQAR experiment in ``out`` (a directory per run and seed): a rerun reads the finished runs' results back
    and resumes a stopped run from its checkpoint. A run stopped by Ctrl-C or SIGTERM is not recorded; the stop (a
    KeyboardInterrupt) goes up to the job, which exits 130."""
    from linlm.experiments.mqar import plot_experiment, run_experiment
    from linlm.experiments.mqar_summary import comparison_groups, summarize

    plan = run_settings(settings)
    task = plan["task"]
    rows = run_experiment(plan["runs"], task, out, threads=1, what="--out", on_fraction=tick, **plan["train"])
    configs = summarize(rows)
    plot_experiment(configs, plots / "mqar.png", "--out")
    chance = 1.0 / max(1, task.vocab_size - 1 - task.num_keys)
    return {"task": asdict(task), "chance": chance, "settings": settings, "seeds": plan["seeds"], "rows": configs,
            "runs": rows, "groups": comparison_groups(configs), "plot": "mqar.png"}


def run(job, tick: Tick) -> Optional[dict]:
    p = job.recipe
    if p.mode == "torchrun" and not job.train_here:
        job.waiting["mqar"] = (f"recipe {p.name} trains MQAR's models on the cluster's GPUs, not here: run "
                               f"`linlm reproduce --recipe {p.name} --out {job.out} --train-here` on a GPU node")
        return None
    return measure(p.mqar, job.out / "mqar", job.plots, tick)


def render(job, pending: list[str]) -> Blocks:
    from linlm.experiments.mqar_summary import config_table, group_table

    b, m = heading(job, "Retrieval: MQAR", pending, "mqar")
    if m is None:
        return b
    seeds = m.get("seeds") or [0]
    b.append(("p", f"Multi-query associative recall: {m['task']['num_kv']} key-value pairs, vocabulary "
                   f"{m['task']['vocab_size']}, chance {m['chance']:.3f}. Each model is trained on MQAR and tested "
                   f"on held-out sequences, with {len(seeds)} seed(s); accuracy is the seeds' mean, with their min "
                   "and max. MossNet runs with E SSM experts under each routing policy; the groups compare models "
                   "at equal active parameters and at equal state per layer."))
    if m["rows"]:
        b.append(("table", *config_table(m["rows"])))
    if m.get("groups"):
        b.append(("table", *group_table(m["groups"])))
    img = image(job, m["plot"])
    if img:
        b.append(img)
    return b


SECTION = Section("mqar", run, 0.14, render=render, report_rank=5, trees=("mqar",), plots=("mqar.png",),
                  plan=lambda p: f"MQAR: widths {p.mqar.get('widths')}, MossNet experts {p.mqar.get('experts')} x "
                                 f"policies {p.mqar.get('policies')}, {p.mqar.get('seeds', 1)} seed(s), "
                                 f"{p.mqar.get('steps')} steps per model")
