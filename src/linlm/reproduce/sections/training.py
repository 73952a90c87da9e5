"""The training sections: ``scaling`` (the recipe's scaling ladder, in DIR/scaling or --scaling-dir) and
``compare`` (MossNet, Mamba and LLaMA at equal active parameters and tokens, in DIR/compare).

A local recipe trains the sweep here through :func:`linlm.scaling.runner.run_grid`, which skips finished runs and
resumes interrupted ones; a torchrun recipe writes one torchrun command per run into DIR/torchrun.sh and waits
until the cluster has run them. Either way the section is done only when every run has reached its steps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from linlm import outputs
from linlm.errors import ConfigError, LinlmError
from linlm.reproduce.section import Section, Tick, setting


@dataclass
class SeedRungs:
    """More seeds of some rungs of the scaling ladder, for some architectures: the seed spread the fits' intervals
    are drawn from (linlm.scaling.fits_seeds)."""

    rungs: list[str]
    archs: list[str]
    count: int = 2


def load_ladder_named(name: str):
    """A built-in ladder, its errors under the recipe's key ``ladder``."""
    from linlm.scaling.ladder import load_ladder

    try:
        return load_ladder(name)
    except ConfigError as e:
        raise ConfigError(f"ladder: {str(e).removeprefix('--ladder: ')}") from None


MAX_KEPT = 1000  # checkpoints kept along training per run, at most


@dataclass
class ScalingSettings:
    """The recipe's ``scaling:``."""

    ladder: str = setting(dataclasses.MISSING, "the scaling ladder: a built-in ladder of linlm/scaling/ladders/")
    archs: Optional[list[str]] = setting(None, "the architectures trained on the ladder, some of its own (null: "
                                               "every one of the ladder's)")
    seeds: Optional[SeedRungs] = setting(None, "{rungs, archs, count}: those rungs trained count times for those "
                                               "archs (rungs RUNG-s1, ...; train seeds the ladder's + 1, ...): the "
                                               "seed spread of the fits' intervals (null: none, no intervals)")
    keep_log: int = setting(0, "checkpoints each run keeps along training, log-spaced (checkpoint.keep_log), for "
                               "the downstream section (0: none, and no downstream section)")

    def validate(self) -> "ScalingSettings":
        from linlm.reproduce.seeds import MAX_SEEDS

        if not 0 <= self.keep_log <= MAX_KEPT:
            raise ConfigError(f"keep_log: {self.keep_log}; give 0 (no checkpoints kept along training) to {MAX_KEPT}")
        ladder = self.load()  # refuses archs that are not the ladder's own
        if self.seeds is not None:
            names = [r.name for r in ladder.rungs if r.archs is None]
            bad = [r for r in self.seeds.rungs if r not in names] + [a for a in self.seeds.archs
                                                                     if a not in ladder.archs]
            if bad or not self.seeds.rungs or not 2 <= self.seeds.count <= MAX_SEEDS:
                raise ConfigError(f"seeds: {bad or self.seeds}; name rungs ({', '.join(names)}) and architectures "
                                  f"({', '.join(ladder.archs)}) of ladder {self.ladder}, and a count from 2 to "
                                  f"{MAX_SEEDS}")
        return self

    def load(self):
        """The ladder, with the seed rungs added."""
        from linlm.schema import deep_merge

        ladder = load_ladder_named(self.ladder)
        if self.keep_log:
            ladder = dataclasses.replace(ladder, train=deep_merge(ladder.train,
                                                                  {"checkpoint": {"keep_log": self.keep_log}}))
        if self.archs is not None:
            bad = [a for a in self.archs if a not in ladder.archs]
            if bad or not self.archs or len(set(self.archs)) != len(self.archs):
                raise ConfigError(f"archs: {bad or self.archs}; name each once, among ladder {self.ladder}'s "
                                  f"({', '.join(ladder.archs)})")
            ladder = dataclasses.replace(ladder, archs=list(self.archs))
        if self.seeds is None:
            return ladder
        base = int(ladder.train.get("seed") or 0)
        extra = [dataclasses.replace(r, name=f"{r.name}-s{i}", archs=list(self.seeds.archs),
                                     train=deep_merge(r.train, {"seed": base + i}))
                 for r in ladder.rungs if r.name in self.seeds.rungs for i in range(1, self.seeds.count)]
        return dataclasses.replace(ladder, rungs=[*ladder.rungs, *extra])


@dataclass
class CompareSettings:
    """The recipe's ``compare:``: a ladder mapping (linlm.scaling.ladder.ladder_from_dict: name, archs, rungs,
    train, jobs, ...) of one rung, trained once per seed, plus ``seeds``."""

    seeds: int = setting(1, "trainings of each architecture, with train config seeds 0, 1, ... past the ladder's "
                            "own (linlm.reproduce.seeds)")
    ladder: dict = setting({}, "the rest of the mapping: the comparison's ladder (name, archs, rungs, train, ...)")

    @classmethod
    def from_recipe(cls, data: dict, where: str) -> "CompareSettings":
        from linlm.reproduce.seeds import seed_count, seeded_ladder
        from linlm.scaling.ladder import ladder_from_dict

        seeds = seed_count(data, f"{where}.seeds")
        ladder = {k: v for k, v in data.items() if k != "seeds"}
        ladder_from_dict(seeded_ladder(ladder, seeds), "compare", where)
        return cls(seeds, ladder)


def train_sweep(ladder, out: Path, tick: Tick, say: Callable[[str], None], overrides: dict,
                what: str = "--out") -> dict:
    from linlm.scaling.runner import run_grid

    return run_grid(ladder, None, out, overrides=overrides, say=say, on_fraction=tick, what=what)


def train(job, name: str, tick: Tick) -> dict:
    """The sweep trained here. An interrupted sweep stops the job (KeyboardInterrupt, exit 130); the section is
    done only when every run of it has reached its steps."""
    from linlm.scaling.ladder import plan_runs
    from linlm.scaling.runs import run_finished

    ladder, sweep = job.ladder(name), job.sweep(name)
    res = train_sweep(ladder, sweep, tick, job.say, job.overrides, job.sweep_flag(name))
    if res["interrupted"]:
        raise KeyboardInterrupt
    runs = plan_runs(ladder, None, sweep, job.overrides)
    unfinished = [r.name for r in runs if not run_finished(Path(r.config.out_dir), r.config.steps)]
    if unfinished:
        raise LinlmError(f"{name}: {len(unfinished)} of {len(runs)} runs did not reach their steps "
                         f"({outputs.shown(unfinished)}); run the same command again to resume them")
    return {"ladder": ladder.name, "runs": [r.name for r in runs]}


def emit(job, name: str) -> Optional[dict]:
    """torchrun mode: write the commands once; the section is done when every run has finished."""
    from linlm.scaling.ladder import plan_runs
    from linlm.scaling.plan import emit_torchrun
    from linlm.scaling.runs import run_finished

    ladder, sweep = job.ladder(name), job.sweep(name)
    runs = plan_runs(ladder, None, sweep, job.overrides)
    script = job.out / "torchrun.sh"
    old = script.read_text(encoding="utf-8") if script.is_file() else "#!/usr/bin/env bash\nset -euo pipefail\n"
    if f"# {name}\n" not in old:
        lines = emit_torchrun(ladder, runs, sweep, job.sweep_flag(name))
        outputs.write_text(script, old + f"# {name}\n" + "\n".join(lines) + "\n", "--out")
        script.chmod(0o755)
    pending = [r.name for r in runs if not run_finished(Path(r.config.out_dir), r.config.steps)]
    if pending:
        job.waiting[name] = (f"{len(pending)} of {len(runs)} runs have not finished; run {script} on the "
                             "cluster, then this command again")
        job.say(f"{name}: {job.waiting[name]}")
        return None
    return {"ladder": ladder.name, "runs": [r.name for r in runs]}


def check(job, name: str, kept: Callable[[str], str], replace: bool) -> None:
    """Before any work: every --set against the training config, and the sweep directory (a sweep of this
    ladder, its started runs started with these settings, no other process training in it)."""
    from linlm.scaling.ladder import plan_runs
    from linlm.scaling.sweepdir import check_started_runs, check_sweep_dir

    ladder = job.ladder(name)
    if name == "compare" and job.seed_count > 1 and "seed" in job.overrides:
        raise ConfigError(f"--set seed{kept('overrides')}: the comparison trains each architecture once per seed "
                          f"({job.seed_count} seeds); a --set seed would give every run the same one. Drop it, or "
                          "give --seeds 1 (nothing was changed)")
    seeded = sorted(r.name for r in ladder.rungs if "seed" in r.train)
    if "seed" in job.overrides and seeded and job.seed_count == 1:  # more seeds: refused as the comparison's
        raise ConfigError(f"--set seed{kept('overrides')}: {name}'s ladder {ladder.name} gives rungs seeds of their "
                          f"own ({', '.join(seeded[:3])}): a --set seed would give them all one seed, and the fits "
                          "would refuse their runs as copies after they trained. Drop it (nothing was changed)")
    try:
        runs = plan_runs(ladder, None, job.sweep(name), job.overrides)
    except ConfigError as e:
        raise ConfigError(f"--set{kept('overrides')}: {e}; nothing was changed") from None
    external = name == "scaling" and job.scaling_dir is not None  # checked with --scaling-dir; never removed
    if not (external or replace):
        check_sweep_dir(job.sweep(name), ladder, "--out")
    if external or not replace:
        check_started_runs(runs, job.sweep_flag(name))


def training_section(name: str, weight: float, settings: tuple[str, ...]) -> Section:
    def run(job, tick: Tick) -> Optional[dict]:
        return emit(job, name) if job.recipe.mode == "torchrun" else train(job, name, tick)

    return Section(name, run, weight, settings=settings, training=True,
                   check=lambda job, kept, replace: check(job, name, kept, replace), trees=(name,))


SCALING = dataclasses.replace(training_section("scaling", 0.55, ("overrides", "scaling_dir")), key="scaling",
                              options=ScalingSettings)
COMPARE = dataclasses.replace(training_section("compare", 0.21, ("overrides", "seeds")), key="compare",
                              options=CompareSettings)
