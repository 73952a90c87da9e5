"""What the claims read from the sections' results, as typed records: each section's JSON is read here, once, and
the claims see only these fields (a missing section is None).

- :class:`Fits`: a fits section (the scaling ladder's, MossNet's): each architecture's L(C) with its replicates,
  why a fit was refused, and the common compute C* with each architecture's loss and optimum there.
- :func:`seeded`: a number of trained models per seed, by group ({group: {seed: value}}).
- :class:`Retrieval`: an MQAR section's runs (each configuration and seed), its chance level, which run
  plateaued (a run whose loss never left chance did not: :mod:`linlm.experiments.mqar_plateau`), and a study's tags
  (the shape or the context of a run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass
class Law:
    """One architecture's L(C) = beta C^alpha (C in PFLOP/s-days) and its seed replicates (log beta, alpha)."""

    alpha: float
    beta: float
    samples: list
    runs: int
    sizes: int
    points: int
    failed: int
    spread: Optional[str]  # where its seed spread came from (None: no interval)

    def alpha_samples(self) -> list[float]:
        return [b for _, b in self.samples]


@dataclass
class Optimum:
    """One architecture at the common compute C*: its fitted loss, N_opt and D_opt, each with replicates."""

    loss: float
    loss_samples: list
    n_opt: Optional[float]
    d_opt: Optional[float]
    n_samples: list
    d_samples: list
    why: Optional[str]


@dataclass
class Fits:
    laws: dict[str, Law]
    errors: dict[str, str]  # arch -> why its L(C) fit was refused
    c_star: Optional[float]
    c_why: Optional[str]
    optimum: dict[str, Optimum]
    params: tuple[float, float]  # the smallest and largest N trained
    not_run: Optional[str] = None

    @classmethod
    def read(cls, result: Optional[dict]) -> Optional["Fits"]:
        if not result:
            return None
        if "not_run" in result:
            return cls({}, {}, None, None, {}, (0.0, 0.0), not_run=result["not_run"])
        laws, errors = {}, {}
        for arch, f in (result.get("archs") or {}).items():
            env = f.get("envelope") or {}
            law = env.get("L(C)")
            why = f.get("errors") or {}
            if law is None:
                errors[arch] = why.get("envelope") or "no L(C) fit"
                continue
            reps = env.get("replicates") or {}
            laws[arch] = Law(law["alpha"], law["beta"], law.get("samples") or [], env.get("runs", 0),
                             env.get("sizes", 0), env.get("points", 0), reps.get("failed", 0),
                             (reps.get("spread") or {}).get("source"))
            if not law.get("samples"):
                errors[arch] = why.get("intervals") or "its fit has no seed replicates"
        opt = result.get("compute_optimal") or {}
        optimum = {a: Optimum(r.get("loss"), r.get("loss_samples") or [], r.get("N_opt"), r.get("D_opt"),
                              r.get("N_opt_samples") or [], r.get("D_opt_samples") or [], r.get("why"))
                   for a, r in (opt.get("archs") or {}).items()}
        params = [r["params"] for r in result.get("runs") or []]
        return cls(laws, errors, opt.get("compute_pflops_days"), opt.get("why"), optimum,
                   (min(params), max(params)) if params else (0.0, 0.0))

    def scale(self) -> str:
        """The scale every verdict from these fits names: the common compute and the sizes trained."""
        lo, hi = self.params
        at = f"at about {self.c_star:.0e} PFLOP/s-days, " if self.c_star else ""
        return f"{at}{_millions(lo)}-{_millions(hi)}M parameters"


def _millions(n: float) -> str:
    return f"{n / 1e6:.2g}"


def seeded(models: dict, key: str, group: Callable[[dict], str] = lambda m: m.get("group") or m["arch"]
           ) -> dict[str, dict]:
    """{group: {seed: value of ``key``}} over ``models`` (a section's models by label)."""
    out: dict[str, dict] = {}
    for m in (models or {}).values():
        value = m.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out.setdefault(group(m), {})[m.get("seed", 0) or 0] = float(value)
    return out


@dataclass
class Run:
    """One MQAR run: a configuration (``config``: its name without the width) and a seed."""

    config: str
    arch: str
    d_model: int
    seed: int
    accuracy: Optional[float]
    plateaued: Optional[bool]
    steps: int
    study: dict = field(default_factory=dict)  # a study's tags: {"shape": "d64-l4"} or {"context": 256}
    state_per_layer: Optional[float] = None  # decoding-state floats per layer (linlm.eval.mqar.state_floats)
    at_chance: bool = False  # its recent training loss never left chance's (so it has not plateaued)
    copying: bool = False  # past chance, but no better than copying a value of its context (recorded since then)

    @property
    def stopped(self) -> str:
        """Why this run does not count as trained to a plateau ("" when it does)."""
        if self.at_chance:
            return "at chance"
        if self.copying:
            return "copying a context value"
        if self.plateaued:
            return ""
        return "not plateaued" if self.plateaued is False else "plateau not recorded"


@dataclass
class Retrieval:
    """An MQAR section's runs, its chance level and its task."""

    runs: list[Run]
    chance: float
    pairs: int
    not_run: Optional[str] = None

    @classmethod
    def read(cls, result: Optional[dict]) -> Optional["Retrieval"]:
        if not result:
            return None
        if "not_run" in result:
            return cls([], 0.0, 0, not_run=result["not_run"])
        from linlm.experiments.mqar_plateau import at_chance

        chance = float(result.get("chance", 0.0))

        def stuck(r: dict) -> bool:  # recorded by newer runs; read from the recent loss for older ones
            if "at_chance" in r:
                return bool(r["at_chance"])
            return "loss_last_window" in r and chance > 0 and at_chance(r["loss_last_window"], chance)

        runs = [Run(r["name"].rsplit("-d", 1)[0], r["arch"], r["d_model"], r.get("seed", 0) or 0, r.get("accuracy"),
                    r.get("plateaued"), r.get("steps", 0), r.get("study") or {}, r.get("state_per_layer"), stuck(r),
                    bool(r.get("copying")))
                for r in result.get("runs") or result.get("rows") or []]
        return cls(runs, chance, int((result.get("task") or {}).get("num_kv", 0)))

    def width(self) -> Optional[int]:
        """The width the claims are judged at: the largest."""
        return max((r.d_model for r in self.runs), default=None)

    def values(self, config: str, width: Optional[int] = None, **study) -> dict:
        """{seed: accuracy} of ``config`` at ``width`` (default: the largest), among runs with these study tags."""
        width = width or self.width()
        return {r.seed: r.accuracy for r in self.runs if r.config == config and r.d_model == width
                and r.accuracy is not None and all(r.study.get(k) == v for k, v in study.items())}

    def state(self, config: str, width: Optional[int] = None) -> Optional[float]:
        """The state per layer ``config``'s runs recorded at ``width`` (default: the largest); None when none did."""
        width = width or self.width()
        return next((r.state_per_layer for r in self.runs if r.config == config and r.d_model == width
                     and r.state_per_layer is not None), None)

    def not_plateaued(self, config: str, width: Optional[int] = None) -> list[str]:
        """The runs of ``config`` that stopped before their loss plateaued (or whose plateau was not recorded)."""
        width = width or self.width()
        return [f"seed {r.seed} ({r.stopped})" for r in self.runs
                if r.config == config and r.d_model == width and r.stopped]

    def study_values(self, arch: str, key: str) -> dict:
        """{seed: max - min of the accuracy over the study's ``key`` values (shapes, contexts)} of ``arch``: the
        spread across shapes, one number per seed (seeds pair across shapes: one seed, one data order)."""
        by: dict[int, list[float]] = {}
        for r in self.runs:
            if r.arch == arch and key in r.study and r.accuracy is not None:
                by.setdefault(r.seed, []).append(r.accuracy)
        levels = len({r.study[key] for r in self.runs if r.arch == arch and key in r.study})
        return {s: max(v) - min(v) for s, v in by.items() if len(v) == levels and levels >= 2}

    def study_not_plateaued(self, arch: str, key: str) -> list[str]:
        return [f"{r.study[key]} seed {r.seed} ({r.stopped})" for r in self.runs
                if r.arch == arch and key in r.study and r.stopped]


# ---- what a published results file keeps ------------------------------------------------------------------------

_RUN_FIELDS = ("name", "arch", "d_model", "n_layers", "seed", "accuracy", "plateaued", "at_chance", "copying",
               "loss_last_window", "steps", "lr", "study", "active_params", "state_per_layer")


def _fits_kept(result: dict) -> dict:
    if "not_run" in result:
        return {"not_run": result["not_run"]}
    archs = {}
    for arch, f in (result.get("archs") or {}).items():
        env = f.get("envelope") or None
        kept = None if env is None else {k: env.get(k) for k in ("L(C)", "runs", "sizes", "points", "fitted_sizes",
                                                                 "seeds_per_size", "compute_range", "replicates",
                                                                 "envelope")}
        archs[arch] = {"envelope": kept, "errors": f.get("errors") or {}}
    return {"archs": archs, "compute_optimal": result.get("compute_optimal"),
            "runs": [{k: r.get(k) for k in ("run", "arch", "params")} for r in result.get("runs") or []]}


def published(results: dict) -> dict:
    """The parts of the sections' results the claims read, and nothing else: what a published results file keeps
    so that every verdict can be computed again from it (the fits' L(C) laws with their replicates and fitted
    points and the common compute; every trained model's value per seed; MQAR's runs with their plateau)."""
    from linlm.reproduce.claims import CLAIMS

    out: dict = {}
    for name in dict.fromkeys(n for c in CLAIMS for n in c.reads):
        result = results.get(name)
        if not result:
            continue
        if name.endswith("fits"):
            out[name] = _fits_kept(result)
        elif name == "compare_quality":
            out[name] = {"models": {k: {f: m.get(f) for f in ("arch", "group", "seed", "val_loss", "params")}
                                    for k, m in (result.get("models") or {}).items()}}
        elif name == "decode":
            out[name] = {"rows": [{f: r.get(f) for f in ("arch", "context", "state_bytes", "peak_memory_bytes",
                                                         "error")} for r in result.get("rows") or []]}
        elif "not_run" in result:
            out[name] = {"not_run": result["not_run"]}
        else:
            out[name] = {"task": result.get("task"), "chance": result.get("chance"),
                         "runs": [{f: r.get(f) for f in _RUN_FIELDS if f in r} for r in result.get("runs") or []]}
    return out
