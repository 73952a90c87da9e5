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

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from linlm.errors import ConfigError
from linlm.eval.mqar import MQARConfig
from linlm.reproduce.section import Blocks, Section, Tick, heading, image, setting


@dataclass
class MQARSettings:
    """The recipe's ``mqar:``."""

    task: MQARConfig = setting(MQARConfig(), "the task: vocab_size, num_kv (key-value pairs), num_queries")
    widths: list[int] = setting([32, 64], "d_model of every configuration")
    archs: Optional[list[str]] = setting(None, "architectures trained at each width (null: every registered one "
                                               "but the mixtures of experts)")
    experts: list[int] = setting([1, 2, 4], "MossNet's SSM expert counts ([]: no MossNet runs)")
    policies: list[str] = setting(["routed-k1", "routed-k2", "dense"], "MossNet's routing policies: routed-kN, "
                                                                       "dense, dense-kN")
    matched: bool = setting(True, "train the baselines sized to MossNet (equal active parameters, equal state)")
    seeds: int = setting(1, "seeds per configuration, from seed")
    seed: int = setting(0, "the first seed")
    steps: int = setting(300, "training steps per model")
    batch_size: int = setting(32, "sequences per step")
    lr: float = setting(3e-3, "peak learning rate (cosine schedule)")
    n_layers: int = setting(2, "layers of every model")
    head_dim: int = setting(16, "head dimension (widths must be multiples of it)")
    test_sequences: int = setting(512, "held-out sequences each model is tested on")

    def validate(self) -> "MQARSettings":
        from linlm.experiments.mqar_grid import parse_policy

        self.task.validate()
        for key in ("seeds", "steps", "batch_size", "n_layers", "head_dim", "test_sequences"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}: {getattr(self, key)}; give a whole number >= 1")
        if not self.lr > 0:
            raise ConfigError(f"lr: {self.lr}; give a positive learning rate")
        if self.seed < 0:
            raise ConfigError(f"seed: {self.seed}; give a seed >= 0")
        for p in self.policies:
            parse_policy(p)
        if any(e < 1 for e in self.experts):
            raise ConfigError(f"experts: {self.experts}; give SSM expert counts >= 1 ([] for no MossNet runs)")
        bad = [w for w in self.widths if w < 1 or w % self.head_dim]
        if not self.widths or bad:
            raise ConfigError(f"widths: {self.widths}; give widths that are multiples of head_dim {self.head_dim}")
        if self.archs is not None:
            from linlm.models.registry import arch_names

            unknown = [a for a in self.archs if a not in arch_names()]
            if unknown:
                raise ConfigError(f"archs: unknown architecture(s) {unknown}; registered: {arch_names()}")
        return self

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.seed, self.seed + self.seeds))


def run_settings(settings: MQARSettings) -> dict:
    """The experiment's runs and training options from the recipe's ``mqar:`` settings."""
    from linlm.experiments.mqar import default_runs

    task = settings.task
    train = {k: getattr(settings, k) for k in ("steps", "batch_size", "lr", "n_layers", "head_dim",
                                                 "test_sequences")}
    shape = {"n_layers": settings.n_layers, "head_dim": settings.head_dim, "vocab_size": task.vocab_size,
             "seq_len": task.seq_len}
    kw = {"archs": tuple(settings.archs)} if settings.archs is not None else {}
    runs = default_runs(tuple(settings.widths), list(settings.experts), policies=tuple(settings.policies),
                        seeds=settings.seed_list, matched=settings.matched, **shape, **kw)
    return {"task": task, "runs": runs, "train": train, "seeds": settings.seed_list}


def measure(settings: MQARSettings, out: Path, plots: Path, tick: Tick) -> dict:
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
    return {"task": asdict(task), "chance": chance, "settings": asdict(settings), "seeds": plan["seeds"], "rows": configs,
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


def plan(p) -> str:
    m = p.mqar
    moss = (f"MossNet experts {m.experts} x policies {m.policies}" if m.experts else "no MossNet")
    return (f"MQAR: {m.task.num_kv} pairs, widths {m.widths}, {moss}, {m.seeds} seed(s), {m.steps} steps per model")


SECTION = Section("mqar", run, 0.14, render=render, report_rank=5, trees=("mqar",), plots=("mqar.png",), plan=plan,
                  key="mqar", options=MQARSettings)
