"""Ladders: a grid of model sizes (rungs), each trained for a token budget, for several architectures.

A ladder is a YAML file (the built-in ones live in ``linlm/scaling/ladders/``: ``paper``, ``cpu``, ``smoke``)::

    name: cpu
    description: ...
    archs: [llama, tnl]                      # optional: the default --archs (else the scaling study's set)
    max_epochs: 4                            # no run may see its training data more often than this
    jobs: 1                                  # runs trained at once, each in its own process (--jobs overrides)
    train: {...}                             # TrainConfig keys shared by every run (data, optim, schedule, ...)
    rungs:
      - name: 0.1m
        model: {n_layers: 2, d_model: 64, n_heads: 2}    # ModelConfig fields, or {preset: paper-70m}
        tokens: 2_500_000                                # training tokens of this rung
        per_arch: {tnl: {n_layers: 25}}                  # optional: fields where an architecture departs
        train: {optim: {lr: 2.0e-3}}                     # optional: TrainConfig keys for this rung only

A ladder may give a ``study`` (one size at several shapes or contexts) instead of ``rungs``: see
:mod:`linlm.scaling.studies`. Its rungs carry ``tags`` (the shape, the context, the seed), which each run's
scaling.json records.

Every (architecture, rung) pair becomes a :class:`PlannedRun`: a validated TrainConfig whose ``steps`` is the
rung's tokens over the tokens per step (rounded up), plus the parameter and FLOP counts of its model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from linlm.schema import deep_merge, from_dict, load_yaml
from linlm.errors import ConfigError, LinlmError, choices_text
from linlm.models.cost import plan_cost, training_flops
from linlm.scaling.studies import check_study_run, expand_study

LADDER_DIR = Path(__file__).resolve().parent / "ladders"


def _study_archs() -> list[str]:
    from linlm.models.registry import arch_names

    return arch_names(scaling_study=True)


@dataclass
class Rung:
    name: str
    model: dict
    tokens: int
    per_arch: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)  # what a study's rung varies: {shape, d_model, n_layers, seed}, ...
    archs: Optional[list[str]] = None  # the architectures this rung trains (None: every one of the ladder's)


@dataclass
class Ladder:
    name: str
    rungs: list[Rung]
    description: str = ""
    # The default --archs: the architectures of the scaling study (ArchSpec.scaling_study), read at build time.
    archs: list[str] = field(default_factory=_study_archs)
    max_epochs: float = 4.0
    train: dict = field(default_factory=dict)
    # Extra torchrun arguments for --emit torchrun (e.g. "--nnodes=4 --nproc_per_node=8").
    torchrun: str = "--nproc_per_node=8"
    # Runs trained at the same time on this machine, each in a worker process (linlm.train.workers).
    jobs: int = 1
    # A study's ladder: {kind: aspect | context} (linlm.scaling.studies); {} for a ladder of sizes.
    study: dict = field(default_factory=dict)

    def rung(self, name: str) -> Rung:
        for r in self.rungs:
            if r.name == name:
                return r
        raise ConfigError(f"ladder {self.name}: no rung {name!r}; rungs are {choices_text(r.name for r in self.rungs)}")


def builtin_ladders() -> list[str]:
    return sorted(p.stem for p in LADDER_DIR.glob("*.yaml"))


def load_ladder(spec: str) -> Ladder:
    """A built-in ladder by name (``cpu``) or a YAML file by path."""
    path = Path(spec)
    if not (spec.endswith((".yaml", ".yml")) or path.is_file()):
        path = LADDER_DIR / f"{spec}.yaml"
        if not path.is_file():
            raise ConfigError(f"--ladder: unknown ladder {spec!r}; built-in ladders are "
                              f"{choices_text(builtin_ladders())}, or give the path of a YAML ladder")
    return ladder_from_dict(load_yaml(path), path.stem, str(path))


def ladder_from_dict(data: dict, default_name: str, where: str) -> Ladder:
    """A ladder from its YAML mapping (``where`` names it in errors: a file, or the reproduce recipe that holds it)."""
    path = where
    data = expand_study(data, where)
    rungs = data.get("rungs") if isinstance(data, dict) else None
    if not isinstance(rungs, list) or not rungs:
        raise ConfigError(f"{path}: rungs: expected a non-empty list of rungs (name, model, tokens), or a study")
    try:
        parsed = [from_dict(Rung, r, prefix=f"rungs[{i}].") for i, r in enumerate(rungs)]
        ladder = from_dict(Ladder, {**data, "rungs": parsed, "name": data.get("name", default_name)})
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    names = [r.name for r in ladder.rungs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: rung names must be unique, got {names}")
    for i, r in enumerate(ladder.rungs):
        if not isinstance(r.tokens, int) or r.tokens <= 0:
            raise ConfigError(f"{path}: rungs[{i}].tokens: expected a positive number of tokens, got {r.tokens!r}")
    if not isinstance(ladder.jobs, int) or ladder.jobs < 1:
        raise ConfigError(f"{path}: jobs: expected a whole number of runs to train at once (1 or more), "
                          f"got {ladder.jobs!r}")
    if ladder.max_epochs <= 0:
        raise ConfigError(f"{path}: max_epochs: must be positive, got {ladder.max_epochs}")
    return ladder


@dataclass
class PlannedRun:
    """One (architecture, rung) of a ladder, ready to train."""

    name: str  # "<arch>-<rung>", the run's directory under DIR/runs/
    arch: str
    rung: str
    config: Any  # TrainConfig
    tokens: int  # tokens actually trained: steps x tokens per step
    tokens_per_step: int
    params: int  # non-embedding (active) parameters
    paper_flops_per_token: float  # training FLOPs per token, paper convention (embeddings and LM head excluded)
    head_flops_per_token: float  # training FLOPs per token of the LM head (spent, but not in C), at the vocabulary
    # the config sets, else at linlm.models.cost.STAND_IN_VOCAB: the plan is made before the tokenizer is known

    @property
    def compute(self) -> float:
        """C: the paper FLOPs of the tokens trained."""
        return self.paper_flops_per_token * self.tokens

    @property
    def training_flops(self) -> float:
        """FLOPs the run spends: C plus the LM head's."""
        return training_flops(self.tokens, self.paper_flops_per_token, self.head_flops_per_token)

    @property
    def step_flops(self) -> float:
        """FLOPs one optimizer step spends: the paper FLOPs of its tokens plus the LM head's."""
        return training_flops(self.tokens_per_step, self.paper_flops_per_token, self.head_flops_per_token)


# Training config keys a ladder sets for each of its runs: the run's name says which model it is (its architecture
# and its rung's size), its steps follow from the rung's token budget, and the sweep places it and seeds it.
LADDER_KEYS = {"model.arch": "give the architectures with --archs", "model.preset": "each rung sets the size",
               "model.overrides.d_model": "each rung sets the width",
               "model.overrides.n_layers": "each rung sets the depth",
               "steps": "each run's steps come from its rung's tokens", "out_dir": "each run lives in OUT/runs/NAME",
               "seed": "the sweep seeds its runs"}


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {dotted key: leaf value}."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def owned_keys(ladder: Ladder) -> dict[str, str]:
    """{dotted key: why} for every training config key the ladder decides run by run: :data:`LADDER_KEYS`, and
    each key that a rung or an architecture's ``per_arch`` sets differently from another (what tells its rungs
    apart)."""
    owned = dict(LADDER_KEYS)
    per_rung = []
    for rung in ladder.rungs:
        model = dict(rung.model)
        flat = {"model.preset": model.pop("preset", None)}
        flat.update({f"model.overrides.{k}": v for k, v in model.items()})
        flat.update(_flat(rung.train))
        per_rung.append(flat)
        for arch, over in rung.per_arch.items():
            owned.update({f"model.overrides.{k}": f"rung {rung.name} sets it for {arch}" for k in over})
    for key in {k for flat in per_rung for k in flat}:
        if len({repr(flat.get(key)) for flat in per_rung}) > 1:
            owned.setdefault(key, "the rungs differ in it")
    return owned


def check_ladder_overrides(ladder: Ladder, overrides: Optional[dict], flag: str = "--set") -> None:
    """Refuse, by name, an override of a key the ladder owns (:func:`owned_keys`): a run named llama-xs must train
    LLaMA at rung xs for the rung's tokens. Every other key applies to every run (plan_runs)."""
    owned = owned_keys(ladder)
    for key in _flat(overrides or {}):
        hit = next((k for k in owned if key == k or key.startswith(k + ".") or k.startswith(key + ".")), None)
        if hit is not None:
            raise ConfigError(f"{flag} {key}: ladder {ladder.name} sets {hit} run by run ({owned[hit]}); a run "
                              "named ARCH-RUNG must train that model. Drop it, or write a ladder file with the value "
                              "you want (docs/scaling.md); nothing was changed")


def plan_runs(ladder: Ladder, archs: Optional[list[str]], out_dir: str | Path,
              overrides: Optional[dict] = None) -> list[PlannedRun]:
    """Every (arch, rung) of ``ladder`` as a validated run under ``out_dir/runs``; ``overrides`` (a nested dict
    of TrainConfig keys) apply to every run, after the ladder's own settings."""
    from linlm.models.registry import ARCHITECTURES
    from linlm.train.config_sources import build_config

    archs = list(archs or ladder.archs)
    for a in archs:
        if a not in ARCHITECTURES:
            raise ConfigError(f"--archs: unknown architecture {a!r}; valid choices are {choices_text(ARCHITECTURES)}")
    if len(set(archs)) != len(archs):
        raise ConfigError(f"--archs: {archs} names an architecture twice")
    runs = []
    for rung in ladder.rungs:
        for arch in archs:
            if rung.archs is not None and arch not in rung.archs:
                continue
            name = f"{arch}-{rung.name}"
            where = f"ladder {ladder.name}, rung {rung.name!r}, arch {arch}"
            model = dict(rung.model)
            preset = model.pop("preset", None)
            model.update(rung.per_arch.get(arch, {}))
            tree = deep_merge(ladder.train, rung.train)
            tree = deep_merge(tree, {"model": {"arch": arch, "preset": preset, "overrides": model},
                                     "out_dir": str(Path(out_dir) / "runs" / name), "steps": 1})
            tree = deep_merge(tree, overrides or {})
            try:
                cfg = build_config(None, tree)
                seq_len, batch = cfg.data.seq_len, cfg.batch_size
                tokens_per_step = seq_len * batch
                cfg.steps = max(1, math.ceil(rung.tokens / tokens_per_step))
                cost = plan_cost(cfg.model_config, batch, seq_len)
                check_study_run(rung.tags, cfg, "--set")
            except LinlmError as e:
                raise type(e)(f"{where}: {e}") from None
            runs.append(PlannedRun(
                name=name, arch=arch, rung=rung.name, config=cfg, tokens=cfg.steps * tokens_per_step,
                tokens_per_step=tokens_per_step, params=cost.params,
                paper_flops_per_token=cost.paper_flops_per_token, head_flops_per_token=cost.head_flops_per_token))
    return runs
