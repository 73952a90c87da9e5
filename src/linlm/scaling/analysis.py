"""Every fit of a scaling directory, per architecture: what `linlm scaling fit` prints and the report draws."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from linlm.errors import DataError
from linlm.scaling.fits import (PFLOPS_DAY, Crossover, Envelope, EnvelopeFit, IsoFlopFit, ParametricFit,
                                compute_optimal, crossover_between, envelope, fit_envelope, fit_runs_parametric,
                                isoflop)
from linlm.scaling.fits_common import usable
from linlm.scaling.fits_seeds import SeedSpread, measure_spread, pooled_spread, sizes_of
from linlm.scaling.paper import PAPER_TABLE3
from linlm.scaling.runs import META_FILE, METRICS, Loaded, flops_key, load_runs


def _doc(default, text: str):
    return field(default=default, metadata={"doc": text})


@dataclass
class FitOptions:
    """How the fits are made (the reproduce recipes' ``fits:`` too)."""

    bootstrap: int = _doc(1000, "seed replicates of each envelope fit's intervals (linlm.scaling.fits_seeds)")
    parametric_bootstrap: int = _doc(50, "bootstrap replicates of the L(N, D) fit")
    smooth: int = _doc(5, "logged losses in the local log-log line that smooths each curve before the envelope")
    points: int = _doc(60, "the envelope's compute grid")
    levels: int = _doc(8, "IsoFLOP compute levels")
    seed: int = _doc(0, "the bootstrap's random seed")

    def validate(self) -> "FitOptions":
        from linlm.errors import ConfigError

        for key in ("bootstrap", "parametric_bootstrap", "smooth", "points", "levels", "seed"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key}: {getattr(self, key)}; give a whole number >= 0")
        return self


@dataclass
class ArchFits:
    arch: str
    curves: list
    env: Optional[Envelope] = None  # the envelope itself, drawn even when no law could be fitted to it
    envelope: Optional[EnvelopeFit] = None
    spread: Optional[SeedSpread] = None  # the seed spread its intervals were drawn from
    isoflop: Optional[IsoFlopFit] = None
    parametric: Optional[ParametricFit] = None
    errors: dict = field(default_factory=dict)  # fit name -> why it could not be made


@dataclass
class Analysis:
    root: Path
    loaded: Loaded
    archs: dict[str, ArchFits]
    crossovers: list[Crossover]
    options: FitOptions

    def to_dict(self) -> dict[str, Any]:
        runs = []
        for r in self.loaded.runs:
            c = r.curve
            runs.append({"run": r.name, "arch": c.arch, "params": c.params,
                         "paper_flops_per_token": c.paper_flops_per_token,
                         "tokens": float(c.tokens[-1]), "final_loss": float(c.loss[-1]),
                         "compute_pflops_days": float(c.compute[-1] / PFLOPS_DAY),
                         "epochs": r.meta.get("data", {}).get("epochs"), "finished": r.finished})
        archs = {}
        for name, a in self.archs.items():
            archs[name] = {
                "runs": len(a.curves),
                "envelope": a.envelope.to_dict() if a.envelope else None,
                "isoflop": a.isoflop.to_dict() if a.isoflop else None,
                "parametric": a.parametric.to_dict() if a.parametric else None,
                "errors": a.errors,
                "paper": {k: {"beta": v[0], "alpha": v[1]} for k, v in PAPER_TABLE3.get(name, {}).items()} or None,
            }
        return {"dir": str(self.root), "units": {"compute": "PFLOP/s-days (1 = 8.64e19 FLOPs)",
                                                 "params": "non-embedding parameters", "tokens": "training tokens"},
                "runs": runs, "skipped": [{"run": n, "reason": w} for n, w in self.loaded.skipped],
                "archs": archs, "crossovers": [c.to_dict() for c in self.crossovers],
                "compute_optimal": compute_optimal({a: f.envelope for a, f in self.archs.items() if f.envelope}),
                "options": self.options.__dict__}


def fit_arch(arch: str, curves: list, opt: FitOptions, spread: Optional[SeedSpread] = None) -> ArchFits:
    """Every fit of one architecture; the envelope's intervals are drawn from ``spread`` (its own seeds', or one
    pooled from the other architectures: :func:`seed_spreads`; None: no intervals, and the error says why)."""
    out = ArchFits(arch, curves, spread=spread)
    kw = dict(bootstrap=opt.bootstrap, seed=opt.seed)
    try:
        out.envelope = fit_envelope(curves, points=opt.points, smooth_window=opt.smooth, what=f"{arch} envelope",
                                    spread=spread, **kw)
        out.env = out.envelope.envelope
        if spread is None:
            out.errors["intervals"] = (f"{arch}: no seed spread was measured (no size of any architecture was "
                                       "trained with two seeds), so the fits have no intervals; train a second seed "
                                       "of some sizes")
        elif out.envelope.params is None:
            env = out.env
            size = int(env.params[env.interior][0])
            out.errors["N_opt"] = (f"{arch} N_opt(C), D_opt(C): every fitted envelope point lies on one size "
                                   f"({size:,} parameters), so the optimal size cannot be seen to move with compute; "
                                   "train sizes that overtake one another over a wider range")
    except DataError as e:
        out.errors["envelope"] = str(e)
        try:
            out.env = envelope(curves, points=opt.points, smooth_window=opt.smooth)
        except DataError:
            pass
    try:
        out.isoflop = isoflop(curves, levels=opt.levels, smooth_window=opt.smooth, what=f"{arch} IsoFLOP", **kw)
        if out.isoflop.params is None:
            inside = sum(p.interior for p in out.isoflop.profiles)
            out.errors["isoflop"] = (f"{arch} IsoFLOP: {inside} profile(s) have their minimum inside the sampled "
                                     "sizes, at least 3 are needed to fit N_opt(C); add sizes on both sides of the "
                                     "optimum")
    except DataError as e:
        out.errors["isoflop"] = str(e)
    try:
        out.parametric = fit_runs_parametric(curves, bootstrap=opt.parametric_bootstrap, seed=opt.seed,
                                             what=f"{arch} L(N, D)")
    except DataError as e:
        out.errors["parametric"] = str(e)
    return out


def seed_spreads(by_arch: dict[str, list], opt: FitOptions) -> dict[str, SeedSpread]:
    """Each architecture's seed spread (:mod:`linlm.scaling.fits_seeds`): measured on its own sizes with two
    seeds or more, else pooled from the architectures that have some (none: no architecture gets one)."""
    own = {}
    for arch, curves in by_arch.items():
        found = measure_spread(sizes_of(usable(curves, opt.smooth, 0.0)))
        if found is not None:
            own[arch] = found
    pooled = pooled_spread(own)
    return {arch: own.get(arch, pooled) for arch in by_arch if own.get(arch, pooled) is not None}


def analyze(root: str | Path, *, strict: bool = False, include_unfinished: bool = False,
            options: Optional[FitOptions] = None) -> Analysis:
    import scipy.optimize  # noqa: F401 - load its BLAS first: threadpool_limits acts on the libraries loaded
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # the fits use tiny arrays: BLAS threads only contend with each other
        return _analyze(root, strict, include_unfinished, options or FitOptions())


def check_runs(loaded: Loaded, root: str | Path) -> None:
    """Refuse, naming the file, a run no fit can take (DataError, whatever ``strict`` says):

    - N or the FLOPs per token not a positive number: the laws are lines in log N and log C, and log 0 does not
      exist (numpy's least squares would fail with a LinAlgError that names nothing);
    - a loss of 0 or less: a cross-entropy is positive, so such a log is damaged or is not a training log, and
      the fits would silently leave those points out.
    Unlike a NaN loss (a run that diverged, skipped and named), these say the files themselves are wrong."""
    for r in loaded.runs:
        c = r.curve
        described = r.path / (META_FILE if (r.path / META_FILE).is_file() else "config.yaml")
        for key, value in (("params", c.params), (flops_key(r.meta), c.paper_flops_per_token)):
            if not (math.isfinite(value) and value > 0):
                raise DataError(f"{described}: {key} is {value:g}, and it must be a positive number (run {r.name}); "
                                f"fix that file, or move the run out of {root}")
        bad = [i for i, v in enumerate(c.loss.tolist()) if v <= 0]
        if bad:
            i = bad[0]
            raise DataError(f"{r.path / METRICS}: loss {c.loss[i]:g} at {c.tokens[i]:,.0f} tokens"
                            + (f" and {len(bad) - 1} more record(s) of 0 or less" if len(bad) > 1 else "")
                            + f"; a training loss is positive, so this log is damaged (run {r.name}). Fix the file, "
                              f"or move the run out of {root}")


def _analyze(root: str | Path, strict: bool, include_unfinished: bool, opt: FitOptions) -> Analysis:
    loaded = load_runs(root, strict=strict, include_unfinished=include_unfinished)
    if not loaded.runs:
        why = "; ".join(f"{n}: {w}" for n, w in loaded.skipped[:4])
        raise DataError(f"{root}: no usable runs ({why})")
    check_runs(loaded, root)
    by_arch: dict[str, list] = {}
    for r in loaded.runs:
        by_arch.setdefault(r.curve.arch, []).append(r.curve)
    spreads = seed_spreads(by_arch, opt)
    archs = {a: fit_arch(a, cs, opt, spreads.get(a)) for a, cs in sorted(by_arch.items())}
    fitted = [(a, f.envelope.loss) for a, f in archs.items() if f.envelope is not None]
    crossovers = [crossover_between(a, la, b, lb) for (a, la), (b, lb) in itertools.combinations(fitted, 2)]
    if strict:
        failed = [msg for f in archs.values() for msg in f.errors.values()]
        if failed:
            raise DataError(failed[0])
    return Analysis(Path(root), loaded, archs, crossovers, opt)
