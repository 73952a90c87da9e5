"""The compute-optimal envelope (the paper's method, Chinchilla approach 1) and the laws fitted on it: L(C),
N_opt(C) and D_opt(C).

Every run logs its training loss at fixed token intervals; for each compute value the envelope takes the lowest
loss over the sizes of an architecture (each size's curve, the mean of its seeds, interpolated linearly in log C),
remembers which size gave it (its N) and how many tokens that size had seen at that compute (D). Then
``L = beta C^alpha``, ``N_opt = beta C^alpha`` and ``D_opt = beta C^alpha`` are each a straight line in log-log
space, fitted by least squares (:mod:`linlm.scaling.fits_power`) on the envelope's interior points (where a smaller
and a larger size were both seen to lose). The paper has no irreducible term.

The intervals come from seed replicates (:mod:`linlm.scaling.fits_seeds`): each replicate adds to every size's
curve a draw of the measured seed-to-seed noise and fits the three laws again. Without a measured seed spread a
fit has no interval (and a claim that needs one cannot tell). A fit whose interior points all lie on one size is
refused: one size's learning curve says nothing about how the optimum moves with compute.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence, Union

import numpy as np

from linlm.errors import DataError
from linlm.scaling.fits_common import PFLOPS_DAY, Curve, interp_log, need, usable
from linlm.scaling.fits_power import MIN_POWER_LAW_POINTS, PowerLaw, line, set_samples
from linlm.scaling.fits_seeds import SeedSpread, Size, measure_spread, replicate_rows, sizes_of

ONE_SIZE = "cannot tell: one size"


@dataclass
class Envelope:
    """The lowest loss at each compute value over a set of runs (compute in FLOPs)."""

    compute: np.ndarray
    loss: np.ndarray
    params: np.ndarray  # N of the run on the envelope
    tokens: np.ndarray  # tokens that run had seen at that compute
    run: list[str]  # which run
    # False where the envelope sits on the smallest or the largest size: there the optimum lies outside the
    # sampled sizes, so those points bend the fitted N_opt and L; the fits use only interior points.
    interior: np.ndarray = None


def envelope(curves: Sequence[Curve], *, points: int = 60, smooth_window: int = 1,
             min_tokens_fraction: float = 0.0) -> Envelope:
    """The compute-optimal envelope of ``curves`` on a grid of ``points`` log-spaced compute values.

    ``min_tokens_fraction`` drops the start of each run (its first fraction of tokens), where warmup dominates.
    The grid spans from the smallest compute any run reaches to the largest; a grid value no run covers is left out.
    """
    return envelope_of(usable(curves, smooth_window, min_tokens_fraction), points)


def envelope_of(runs: list, points: int) -> Envelope:
    """The envelope of ``runs``, rows of :func:`linlm.scaling.fits_common.usable` (a run given twice counts once)."""
    need(len(runs), 1, "envelope (runs with at least 2 logged losses)")
    lo = min(c.min() for _, c, _, _ in runs)
    hi = max(c.max() for _, c, _, _ in runs)
    grid = np.geomspace(lo, hi, points)
    table = np.stack([interp_log(grid, c, l) for _, c, l, _ in runs])  # runs x grid
    covered = np.isfinite(table).any(axis=0)
    table = np.where(np.isfinite(table), table, np.inf)  # inf: the run does not reach this compute
    best = np.argmin(table, axis=0)
    grid, best = grid[covered], best[covered]
    loss = table[best, np.flatnonzero(covered)]
    params = np.array([runs[i][0].params for i in best])
    tokens = np.array([grid[j] / runs[i][0].paper_flops_per_token for j, i in enumerate(best)])
    # Bracketed: some run reaching this compute is smaller than the chosen one and some is larger (so both
    # neighbours were seen to be worse). Where the chosen run is the smallest or largest still running, the
    # optimum may lie outside the sampled sizes.
    sizes = np.array([cv.params for cv, _, _, _ in runs])[:, None]
    reach = np.isfinite(table[:, covered])
    interior = ((reach & (sizes < params[None])).any(axis=0) & (reach & (sizes > params[None])).any(axis=0))
    return Envelope(grid, loss, params, tokens, [runs[i][0].name for i in best], interior)


@dataclass
class EnvelopeFit:
    """L(C), N_opt(C) and D_opt(C) fitted on the envelope of an architecture's sizes, C in PFLOP/s-days, each law
    with its seed replicates (``samples``: rows of log beta, alpha) and 95 % percentile intervals. N_opt and D_opt
    are None when the fitted points lie on one size. ``spread``: the seed spread the replicates were drawn from
    (None: no interval); ``replicates`` how many gave all three laws, ``failed`` how many gave too few interior
    points or one size (left out of the intervals, and reported)."""

    loss: PowerLaw
    params: Optional[PowerLaw]
    tokens: Optional[PowerLaw]
    envelope: Envelope
    sizes: list = field(default_factory=list, repr=False)  # the Size records the envelope was taken over
    spread: Optional[SeedSpread] = None
    replicates: int = 0
    failed: int = 0
    seed: int = 0  # the replicates' random stream: (seed, crc32 of the architecture's name)
    arch: str = ""
    interior_only: bool = True

    @property
    def fitted(self) -> np.ndarray:
        """Which envelope points the laws were fitted on."""
        e = self.envelope
        return e.interior if self.interior_only else np.ones(len(e.compute), dtype=bool)

    @property
    def compute_range(self) -> tuple[float, float]:
        """The smallest and largest fitted compute, in PFLOP/s-days."""
        c = self.envelope.compute[self.fitted] / PFLOPS_DAY
        return float(c.min()), float(c.max())

    def replicate_rows(self) -> Iterator[list[tuple]]:
        """The replicates' curves (rows as :func:`linlm.scaling.fits_common.usable` gives them), in the order the
        fit drew them: the same draws each time, so that other readings of the replicates (the optimum at a
        common compute) pair with the laws' samples."""
        if self.spread is None:
            return
        rng = np.random.default_rng([self.seed, zlib.crc32(self.arch.encode())])
        for _ in range(self.replicates + self.failed):
            yield replicate_rows(self.sizes, self.spread, rng)

    def to_dict(self) -> dict:
        e, fitted = self.envelope, self.fitted
        seeds = {f"{s.curve.params:.0f}": s.seeds for s in self.sizes}
        return {"L(C)": law_dict(self.loss), "N_opt(C)": law_dict(self.params), "D_opt(C)": law_dict(self.tokens),
                "points": int(fitted.sum()), "runs": sum(seeds.values()), "sizes": len(self.sizes),
                "fitted_sizes": len(set(e.params[fitted].tolist())), "seeds_per_size": seeds,
                "compute_range": list(self.compute_range),
                "replicates": {"drawn": self.replicates + self.failed, "used": self.replicates,
                               "failed": self.failed, "unit": "seeds (seed noise drawn from the measured spread)",
                               "spread": self.spread.to_dict() if self.spread else None},
                "envelope": {"compute_pflops_days": (e.compute / PFLOPS_DAY).tolist(), "loss": e.loss.tolist(),
                             "params": e.params.tolist(), "tokens": e.tokens.tolist(), "run": e.run,
                             "fitted": fitted.tolist()}}


def law_dict(law: Optional[PowerLaw]) -> Optional[dict]:
    """A law as the fits JSON keeps it: its fit, its intervals and its replicates (log beta, alpha), so that what
    is derived from it can be computed again from the file."""
    if law is None:
        return None
    d = law.to_dict()
    d["samples"] = None if law.samples is None else [[round(float(a), 7), round(float(b), 7)]
                                                     for a, b in law.samples]
    return d


def _line_law(c: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    a, b, r2 = line(np.log(c), np.log(y))
    return a, b, r2


def _laws(env: Envelope, interior_only: bool, what: str, sizes: int) -> tuple[tuple, Optional[tuple],
                                                                             Optional[tuple], int]:
    """((log beta, alpha, R^2) of L, of N_opt, of D_opt (None on one size), points) fitted on ``env``; raises
    DataError when too few points are interior, or (:data:`ONE_SIZE`) when they all lie on one size."""
    use = env.interior if interior_only else np.ones(len(env.compute), dtype=bool)
    if interior_only and use.sum() < MIN_POWER_LAW_POINTS:
        raise DataError(f"{what}: only {int(use.sum())} envelope point(s) lie on a size other than the smallest or "
                        f"largest of the {sizes} size(s); at least {MIN_POWER_LAW_POINTS} are needed. Train at "
                        "least 3 sizes whose loss curves overtake one another (larger sizes, or longer runs)")
    c = env.compute[use] / PFLOPS_DAY
    need(len(c), MIN_POWER_LAW_POINTS, f"{what}: L(C)")
    on = sorted(set(env.params[use].tolist()))
    if interior_only and len(on) < 2:
        raise DataError(f"{what}: {ONE_SIZE}: every fitted envelope point lies on one size ({on[0]:,.0f} "
                        "parameters), so L(C) would be one run's learning curve and N_opt(C) flat; train sizes "
                        "that overtake one another over a wider range")
    loss = _line_law(c, env.loss[use])
    if len(on) < 2:
        return loss, None, None, len(c)
    return loss, _line_law(c, env.params[use]), _line_law(c, env.tokens[use]), len(c)


def _power_law(fit: tuple, n: int) -> PowerLaw:
    a, b, r2 = fit
    return PowerLaw(beta=math.exp(a), alpha=b, r2=r2, n_points=n)


def fit_envelope(curves: Sequence[Curve], *, points: int = 60, smooth_window: int = 1,
                 min_tokens_fraction: float = 0.0, bootstrap: int = 1000, seed: int = 0, interior_only: bool = True,
                 spread: Union[SeedSpread, None, str] = "measure", what: str = "envelope") -> EnvelopeFit:
    """The three laws on the envelope of ``curves``'s sizes (runs of one N are seeds of one size), each with
    ``bootstrap`` seed replicates drawn from ``spread`` (``"measure"``: measured on these curves' own seeds;
    None, or none measurable: no intervals). See the module doc."""
    rows = usable(curves, smooth_window, min_tokens_fraction)
    need(len(rows), 1, "envelope (runs with at least 2 logged losses)")
    sizes = sizes_of(rows)
    if isinstance(spread, str):
        spread = measure_spread(sizes)
    env = envelope_of([s.row() for s in sizes], points)
    arch = curves[0].arch if curves else ""
    loss, n_law, d_law, n = _laws(env, interior_only, what, len(sizes))
    fit = EnvelopeFit(_power_law(loss, n), n_law and _power_law(n_law, n), d_law and _power_law(d_law, n), env,
                      sizes, spread, seed=seed, arch=arch, interior_only=interior_only)
    if spread is None or not bootstrap:
        return fit
    fit.failed = bootstrap  # replicate_rows() draws this many
    reps = np.full((bootstrap, 3, 2), np.nan)  # replicate, (L, N_opt, D_opt), (log beta, alpha)
    for k, rep in enumerate(fit.replicate_rows()):
        try:
            laws = _laws(envelope_of(rep, points), interior_only, what, len(sizes))
        except DataError:
            continue
        for j, law in enumerate(laws[:3]):
            if law is not None:
                reps[k, j] = law[:2]
    fit.failed = 0
    ok = np.isfinite(reps[:, 0]).all(axis=1)
    if n_law is not None:
        ok &= np.isfinite(reps[:, 1:]).all(axis=(1, 2))
    fit.replicates, fit.failed = int(ok.sum()), int(bootstrap - ok.sum())
    if fit.replicates:
        set_samples(fit.loss, reps[ok, 0])
        if fit.params is not None:
            set_samples(fit.params, reps[ok, 1])
            set_samples(fit.tokens, reps[ok, 2])
    return fit
