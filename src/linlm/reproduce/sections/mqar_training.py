"""What the MQAR sections share (``mqar``, and the ``aspect`` and ``context`` studies): how their models train
(:class:`TrainSettings`: seeds, each configuration's learning rate from a small sweep, training to a plateau), the
training itself, its time for ``--dry-run`` (timed now on this machine), and the table of runs the report shows.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from linlm.errors import ConfigError
from linlm.experiments.mqar_plateau import Plateau, at_chance
from linlm.reproduce.section import Tick, setting


@dataclass
class TrainSettings:
    """How an MQAR section's models train (fields shared by ``mqar:``, ``aspect:`` and ``context:``)."""

    seeds: int = setting(1, "seeds per configuration, from seed (a difference needs 2 or more)")
    seed: int = setting(0, "the first seed")
    steps: int = setting(300, "training steps per model, without a plateau rule")
    plateau: Optional[Plateau] = setting(None, "train to a plateau instead: {block, min_steps, max_steps, "
                                               "tolerance, floor, chance_margin, chance_steps} "
                                               "(linlm.experiments.mqar_plateau)")
    lr: float = setting(3e-3, "the learning rate, without a sweep")
    lrs: list[float] = setting([], "a sweep: each configuration trains sweep_steps at each of these (seed 0) and "
                                   "keeps the best ([]: lr for all)")
    sweep_steps: int = setting(200, "steps of each sweep run (even)")
    batch_size: int = setting(32, "sequences per step")
    n_layers: int = setting(2, "layers of every model (a study's shapes set their own)")
    head_dim: int = setting(16, "head dimension (widths must be multiples of it)")
    test_sequences: int = setting(512, "held-out sequences each model is tested on")
    threads: int = setting(1, "torch threads of each training run")
    jobs: int = setting(1, "training runs at once, each in its own process with `threads` threads")

    def check_training(self) -> None:
        from linlm.reproduce.seeds import MAX_SEEDS

        for key in ("steps", "batch_size", "n_layers", "head_dim", "test_sequences", "threads", "jobs"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}: {getattr(self, key)}; give a whole number >= 1")
        if not 1 <= self.seeds <= MAX_SEEDS or self.seed < 0:
            raise ConfigError(f"seeds: {self.seeds}, seed: {self.seed}; give 1 to {MAX_SEEDS} seeds from a seed >= 0")
        if not self.lr > 0 or any(not x > 0 for x in self.lrs):
            raise ConfigError(f"lr: {self.lr}, lrs: {self.lrs}; give positive learning rates")
        if self.lrs and (self.sweep_steps < 2 or self.sweep_steps % 2):
            raise ConfigError(f"sweep_steps: {self.sweep_steps}; give an even number of steps >= 2")
        if self.plateau is not None:
            self.plateau.validate()

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.seed, self.seed + self.seeds))

    def max_steps(self) -> int:
        return self.plateau.max_steps if self.plateau else self.steps

    def how(self) -> str:
        """How the models train, in a sentence of the report."""
        lrs = ", ".join(f"{x:g}" for x in self.lrs)
        lr = (f"each configuration at the best of learning rates {lrs} after {self.sweep_steps} steps on seed 0 (the "
              "sweep's table below)" if self.lrs else f"learning rate {self.lr:g}")
        steps = self.plateau.text() if self.plateau else f"{self.steps} steps (cosine schedule)"
        return f"{self.seeds} seed(s); {lr}; {steps}"


def train_kw(s: TrainSettings) -> dict:
    return {"batch_size": s.batch_size, "lr": s.lr, "n_layers": s.n_layers, "head_dim": s.head_dim,
            "test_sequences": s.test_sequences, "threads": s.threads, "jobs": s.jobs}


def train(settings: TrainSettings, task, configs: list, out: Path, tick: Tick,
          lr_of: Optional[Callable[[object], Optional[float]]] = None) -> tuple[list[dict], dict]:
    """Train ``configs`` (MQARRun, seed 0 each) on every seed: each at the learning rate its sweep chose (when the
    settings sweep), else ``lr_of(config)`` or the settings' lr; to a plateau when the settings give one. Returns
    (the runs' rows, the sweep's table {config: {"losses", "chosen"}})."""
    import dataclasses

    from linlm.experiments.mqar import run_experiment, sweep_learning_rates

    kw = train_kw(settings)
    swept, share = {}, 0.2 if settings.lrs else 0.0
    if settings.lrs:
        swept = sweep_learning_rates(configs, settings.lrs, task, out / "lr-sweep", steps=settings.sweep_steps,
                                     what="--out", on_fraction=lambda f: tick(share * f), **kw)
    runs = []
    for seed in settings.seed_list:
        for c in configs:
            lr = swept[c.name()]["chosen"] if swept else (lr_of(c) if lr_of else None)
            runs.append(dataclasses.replace(c, seed=seed, lr=lr))
    rows = run_experiment(runs, task, out, steps=settings.steps, what="--out", plateau=settings.plateau,
                          on_fraction=lambda f: tick(share + (1 - share) * f), **kw)
    return rows, swept


def seconds(settings: TrainSettings, task, configs: list) -> float:
    """At most how long training ``configs`` takes here: a few steps of each timed now (after one to warm up),
    times its sweep's steps and every seed's max_steps; with ``jobs`` at once, the sweep's runs and then the
    seeds' placed on the first free worker (timed one at a time, so runs sharing the cores may take longer)."""
    import torch

    from linlm.eval.mqar import mqar_batch
    from linlm.experiments.mqar_grid import model_overrides
    from linlm.models.lm import CausalLM
    from linlm.models.presets import preset_config
    from linlm.scaling.progress import wall_seconds

    threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    per_step = {}
    try:
        for c in configs:
            over = model_overrides(c, settings.n_layers, settings.head_dim, task.vocab_size, task.seq_len)
            model = CausalLM(preset_config(c.arch, None, **over))
            opt = torch.optim.AdamW(model.parameters(), 1e-3)
            ids, targets = mqar_batch(task, settings.batch_size, torch.Generator().manual_seed(0))
            for i in range(4):
                if i == 1:
                    t0 = time.perf_counter()
                out = model(ids, targets=targets)
                (out.loss + out.aux_loss).backward()
                opt.step()
                opt.zero_grad()
            per_step[c.name()] = (time.perf_counter() - t0) / 3
    finally:
        torch.set_num_threads(threads)
    sweep = [t * settings.sweep_steps for t in per_step.values() for _ in settings.lrs]
    seeds = [t * settings.max_steps() for _ in settings.seed_list for t in per_step.values()]
    return wall_seconds(sweep, settings.jobs) + wall_seconds(seeds, settings.jobs)


def runs_blocks(result: dict) -> list[tuple]:
    """The report's table of every run: its configuration, seed, learning rate, steps, whether it plateaued and
    its accuracy; and the sweep's table."""
    chance = result.get("chance") or 0.0

    def plateaued(r: dict) -> str:
        if r.get("at_chance") or r.get("copying"):
            return "no (at chance)" if r.get("at_chance") else "no (copying)"
        return {True: "yes", False: "no"}.get(r.get("plateaued"), "-")

    rows = [[r["name"], str(r["seed"]), f"{r.get('lr', 0):g}", str(r["steps"]), plateaued(r),
             "-" if r.get("accuracy") is None else f"{r['accuracy']:.3f}"] for r in result.get("runs") or []]
    blocks = [("table", ["run", "seed", "lr", "steps", "plateaued", "accuracy"], rows)]
    sweep = result.get("lr_sweep") or {}
    if sweep:
        lrs = sorted({k for t in sweep.values() for k in t["losses"]}, key=float)
        chosen = {c: t["losses"].get(f"{t['chosen']:g}") for c, t in sweep.items()}
        stuck = [c for c, x in chosen.items() if chance and x is not None and at_chance(x, chance)]
        blocks.append(("p", "The learning-rate sweep: each configuration's mean training loss over the last tenth of "
                            "its sweep steps at each rate (seed 0); the lowest is chosen ('-': diverged)." +
                       (f" At every rate, {', '.join(stuck)} had not left chance's loss ({-math.log(chance):.3f}), "
                        "so their choice is noise." if stuck else "")))
        blocks.append(("table", ["configuration", *lrs, "chosen"],
                       [[c, *("-" if t["losses"].get(k) is None else f"{t['losses'][k]:.3f}" for k in lrs),
                         f"{t['chosen']:g}"] for c, t in sweep.items()]))
    return blocks
