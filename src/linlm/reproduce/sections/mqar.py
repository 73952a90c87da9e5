"""The ``mqar`` section: the MQAR experiment (:mod:`linlm.experiments.mqar`) with the recipe's settings, in
DIR/mqar: the architectures the retrieval claims compare, and MossNet's configurations for the heads claim. A
torchrun recipe trains its models only where --train-here is given (a GPU node).

Settings (the recipe's ``mqar:``): the task (enough key-value pairs that a small state is the limit: 16-64), the
widths and architectures, MossNet's SSM expert counts and routing policies, the baselines sized to it
(``equal_params``, ``equal_state``, ``wide_to``), and how the models train (:mod:`.mqar_training`: seeds, a
learning-rate sweep per configuration, a plateau rule). The result's ``runs`` are every (configuration, seed) row
with its learning rate and whether it plateaued, ``rows`` the configurations over their seeds, ``groups`` the
comparisons at equal active parameters and at equal state, ``lr_sweep`` the sweep's table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from linlm.errors import ConfigError
from linlm.eval.mqar import MQARConfig, pairs_text
from linlm.reproduce.section import Blocks, Section, Tick, heading, image, setting
from linlm.reproduce.sections.mqar_training import TrainSettings, runs_blocks, seconds, train


@dataclass
class MQARSettings(TrainSettings):
    """The recipe's ``mqar:``."""

    task: MQARConfig = setting(MQARConfig(), "the task: vocab_size, num_kv (key-value pairs), num_queries, gap, mix "
                                             "(smaller pair counts training takes in turn; linlm.eval.mqar)")
    widths: list[int] = setting([32, 64], "d_model of every configuration (the claims read the largest; []: the "
                                          "experiment is not run)")
    archs: Optional[list[str]] = setting(None, "architectures trained at each width (null: every registered one "
                                               "but the mixtures of experts)")
    experts: list[int] = setting([1, 2, 4], "MossNet's SSM expert counts ([]: no MossNet runs)")
    policies: list[str] = setting(["routed-k1", "routed-k2", "dense"], "MossNet's routing policies: routed-kN, "
                                                                       "dense, dense-kN")
    equal_params: bool = setting(True, "train the baseline and SSMs sized to the one-expert MossNet's active "
                                       "parameters")
    equal_state: Optional[list[str]] = setting(None, "SSMs trained with E times MossNet's state per layer (null: "
                                                     "the SSMs among archs)")
    wide_to: Optional[str] = setting(None, "one expert widened to this MossNet's active parameters (e.g. "
                                           "E4-routed-k2; null: none)")
    per_arch: dict = setting({}, "model config keys of one architecture among archs, over the experiment's shape "
                                 "(e.g. the options that give it another's state per layer)")

    def validate(self) -> "MQARSettings":
        from linlm.experiments.mqar_grid import parse_policy

        self.task.validate()
        self.check_training()
        for p in self.policies:
            parse_policy(p)
        if any(e < 1 for e in self.experts):
            raise ConfigError(f"experts: {self.experts}; give SSM expert counts >= 1 ([] for no MossNet runs)")
        bad = [w for w in self.widths if w < 1 or w % self.head_dim]
        if bad:
            raise ConfigError(f"widths: {self.widths}; give widths that are multiples of head_dim {self.head_dim} "
                              "([]: no MQAR experiment)")
        if self.archs is not None:
            from linlm.models.registry import arch_names

            unknown = [a for a in self.archs if a not in arch_names()]
            if unknown:
                raise ConfigError(f"archs: unknown architecture(s) {unknown}; registered: {arch_names()}")
        strays = [a for a in self.per_arch if a not in (self.archs or [])]
        if self.archs is not None and strays:
            raise ConfigError(f"per_arch: {strays} not among archs {self.archs}; add them there or drop their keys")
        self.configs()  # the grid itself: a policy above E, an unknown SSM, a wide_to that is no MossNet
        return self

    def configs(self) -> list:
        """Every configuration of the experiment (MQARRun, seed 0); none without widths (not run)."""
        from linlm.experiments.mqar import default_runs

        if not self.widths:
            return []

        kw = {"archs": tuple(self.archs)} if self.archs is not None else {}
        return default_runs(tuple(self.widths), list(self.experts), policies=tuple(self.policies), seeds=[0],
                            n_layers=self.n_layers, head_dim=self.head_dim, vocab_size=self.task.vocab_size,
                            seq_len=self.task.seq_len, equal_params=self.equal_params, equal_state=self.equal_state,
                            wide_to=self.wide_to, per_arch=self.per_arch, **kw)


def measure(settings: MQARSettings, out: Path, plots: Path, tick: Tick) -> dict:
    """The MQAR experiment in ``out`` (a directory per run and seed, the sweep's in out/lr-sweep): a rerun reads
    the finished runs' results back and resumes a stopped run from its checkpoint. A run stopped by Ctrl-C or
    SIGTERM is not recorded; the stop (a KeyboardInterrupt) goes up to the job, which exits 130."""
    from linlm.experiments.mqar import plot_experiment
    from linlm.experiments.mqar_summary import comparison_groups, summarize

    task = settings.task
    rows, swept = train(settings, task, settings.configs(), out, tick)
    configs = summarize(rows)
    plot_experiment(configs, plots / "mqar.png", "--out")
    chance = task.chance
    return {"task": asdict(task), "chance": chance, "settings": asdict(settings), "seeds": settings.seed_list,
            "rows": configs, "runs": rows, "groups": comparison_groups(configs), "lr_sweep": swept,
            "training": settings.how(), "plot": "mqar.png"}


def run(job, tick: Tick) -> Optional[dict]:
    p = job.recipe
    if p.mode == "torchrun" and not job.train_here:
        job.waiting["mqar"] = (f"recipe {p.name} trains MQAR's models on the cluster's GPUs, not here: run "
                               f"`linlm reproduce --recipe {p.name} --out {job.out} --train-here` on a GPU node")
        return None
    if not p.mqar.widths:
        return {"not_run": f"recipe {p.name} gives no MQAR widths (its key mqar: {{widths: [...]}} runs the "
                           "experiment)"}
    return measure(p.mqar, job.out / "mqar", job.plots, tick)


def render(job, pending: list[str]) -> Blocks:
    from linlm.experiments.mqar_summary import config_table, group_table

    b, m = heading(job, "Retrieval: MQAR", pending, "mqar")
    if m is None:
        return b
    b.append(("p", f"Multi-query associative recall: {pairs_text(m['task'])}, vocabulary "
                   f"{m['task']['vocab_size']}, chance {m['chance']:.3f}. Each model is trained on MQAR and tested "
                   f"on held-out sequences: {m.get('training', '')}. Accuracy is the seeds' mean, with their min and "
                   "max; the groups compare models at equal active parameters and at equal state per layer."))
    if m["rows"]:
        b.append(("table", *config_table(m["rows"])))
    if m.get("groups"):
        b.append(("table", *group_table(m["groups"])))
    b += runs_blocks(m)
    img = image(job, m["plot"])
    if img:
        b.append(img)
    return b


def plan(p) -> str:
    m = p.mqar
    if not m.widths:
        return "MQAR: not in this recipe"
    names = [c.name() for c in m.configs()]
    return (f"MQAR: {pairs_text(asdict(m.task))}; {len(names)} configurations ({', '.join(names)}); {m.how()}")


SECTION = Section("mqar", run, 0.14, render=render, report_rank=5, trees=("mqar",), plots=("mqar.png",), plan=plan,
                  key="mqar", options=MQARSettings,
                  estimate=lambda p: seconds(p.mqar, p.mqar.task, p.mqar.configs()))
