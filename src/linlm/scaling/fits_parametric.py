"""Chinchilla's parametric law L(N, D) = E + A / N^a + B / D^b (Hoffmann et al. 2022, approach 3).

Fitted as Hoffmann et al. do: in log space, ``log L_hat = logsumexp(log A - a log N, log B - b log D, log E)``,
with a Huber loss (delta 1e-3) on ``log L_hat - log L``, minimised by L-BFGS (scipy) from the best points of a
grid of starts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np

from linlm.errors import DataError
from linlm.scaling.fits_bootstrap import percentile_ci, resample_groups, resample_points
from linlm.scaling.fits_common import Curve, need, usable

MIN_CHINCHILLA_POINTS = 8


@dataclass
class ParametricFit:
    """L(N, D) = E + A / N^a + B / D^b (Hoffmann et al. 2022), with bootstrap intervals."""

    E: float
    A: float
    B: float
    a: float
    b: float
    r2: float  # of log L
    n_points: int
    huber_loss: float
    ci: dict = field(default_factory=dict)
    resampled: str = "points"  # what the bootstrap drew: "runs" (whole runs) or "points"

    def __call__(self, n, d):
        n, d = np.asarray(n, dtype=np.float64), np.asarray(d, dtype=np.float64)
        return self.E + self.A / n ** self.a + self.B / d ** self.b

    @property
    def n_exponent(self) -> float:
        """N_opt ~ C^(b / (a + b)) when C is proportional to N D."""
        return self.b / (self.a + self.b)

    @property
    def d_exponent(self) -> float:
        return self.a / (self.a + self.b)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ci"] = {k: list(v) for k, v in self.ci.items()}
        d["N_opt_exponent"], d["D_opt_exponent"] = self.n_exponent, self.d_exponent
        return d


HUBER_DELTA = 1e-3
GRID_CHUNK = 256  # grid starts scored per pass: bounds the memory of the start search at 3 x 256 x points floats
START_POINTS = 2000  # about this many evenly spaced points choose the start (every point is fitted)


def _huber(r: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Huber values and derivatives."""
    small = np.abs(r) <= delta
    val = np.where(small, 0.5 * r * r, delta * (np.abs(r) - 0.5 * delta))
    grad = np.where(small, r, delta * np.sign(r))
    return val, grad


def _parametric_objective(theta: np.ndarray, ln: np.ndarray, ld: np.ndarray, ll: np.ndarray, w: np.ndarray,
                          delta: float):
    """Weighted Huber loss of log L_hat - log L and its gradient; theta = (log A, log B, log E, a, b)."""
    la, lb, le, a, b = theta
    terms = np.stack([la - a * ln, lb - b * ld, np.full_like(ln, le)])
    m = terms.max(axis=0)
    share = np.exp(terms - m)
    s = share.sum(axis=0)
    pred = m + np.log(s)
    share /= s
    val, g = _huber(pred - ll, delta)
    g = g * w
    grad = np.array([np.sum(g * share[0]), np.sum(g * share[1]), np.sum(g * share[2]),
                     np.sum(g * share[0] * -ln), np.sum(g * share[1] * -ld)])
    return float(np.sum(w * val)), grad


def _start_grid() -> np.ndarray:
    """Hoffmann et al.'s grid of initialisations (log A, log B in 0..25; log E in -1..1; a, b in 0..2)."""
    la = np.arange(0.0, 26.0, 5.0)
    le = np.arange(-1.0, 1.01, 0.5)
    ab = np.arange(0.0, 2.01, 0.5)
    g = np.stack(np.meshgrid(la, la, le, ab, ab, indexing="ij"), axis=-1).reshape(-1, 5)
    return g


def _best_starts(grid: np.ndarray, ln, ld, ll, w, delta: float, k: int) -> np.ndarray:
    """The k grid points with the lowest objective (scored in vectorised passes of GRID_CHUNK starts)."""
    scores = []
    for lo in range(0, len(grid), GRID_CHUNK):
        la, lb, le, a, b = (grid[lo : lo + GRID_CHUNK, i : i + 1] for i in range(5))
        terms = np.stack([la - a * ln[None], lb - b * ld[None], np.broadcast_to(le, (len(la), len(ln)))])
        m = terms.max(axis=0)
        pred = m + np.log(np.exp(terms - m).sum(axis=0))
        val, _ = _huber(pred - ll[None], delta)
        scores.append(val @ w)
    return grid[np.argsort(np.concatenate(scores))[:k]]


def _fit_parametric_once(ln, ld, ll, w, starts: np.ndarray, delta: float) -> tuple[np.ndarray, float]:
    from scipy.optimize import minimize

    best, best_val = None, math.inf
    # log A, log B within Hoffmann et al.'s range and a margin; log E below 10 nats; exponents in [0, 5].
    bounds = [(-30.0, 60.0), (-30.0, 60.0), (-20.0, 2.5), (0.0, 5.0), (0.0, 5.0)]
    for x0 in starts:
        res = minimize(_parametric_objective, x0, args=(ln, ld, ll, w, delta), jac=True, method="L-BFGS-B",
                       bounds=bounds, options={"maxiter": 500, "ftol": 1e-14, "gtol": 1e-10})
        if res.fun < best_val:
            best, best_val = res.x, float(res.fun)
    return best, best_val


def fit_parametric(params: Sequence[float], tokens: Sequence[float], loss: Sequence[float], *,
                   weights: Optional[Sequence[float]] = None, groups: Optional[Sequence] = None,
                   bootstrap: int = 200, seed: int = 0, starts: int = 8, delta: float = HUBER_DELTA,
                   what: str = "L(N, D)") -> ParametricFit:
    """Fit L(N, D) to points (N, D, L).

    ``weights`` multiply each point's Huber loss (all 1 when None). ``groups`` labels the points that belong
    together (one label per run): the bootstrap then resamples whole groups (:func:`resample_groups`); without
    it, single points (:func:`resample_points`), which is right only for independent points. Each bootstrap
    replicate starts from the full-data optimum."""
    import scipy.optimize  # noqa: F401 - load its BLAS first: threadpool_limits acts on the libraries loaded
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # 5 parameters and small arrays: BLAS threads only contend with each other
        return _fit_parametric(params, tokens, loss, weights, groups, bootstrap, seed, starts, delta, what)


def _fit_parametric(params, tokens, loss, weights, groups, bootstrap: int, seed: int, starts: int, delta: float,
                    what: str) -> ParametricFit:
    n = np.asarray(params, dtype=np.float64)
    d = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(loss, dtype=np.float64)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=np.float64)
    g = None if groups is None else np.asarray(groups)
    keep = np.isfinite(n) & np.isfinite(d) & np.isfinite(y) & (n > 0) & (d > 0) & (y > 0) & (w > 0)
    ln, ld, ll, w = np.log(n[keep]), np.log(d[keep]), np.log(y[keep]), w[keep]
    w = w * (len(w) / w.sum()) if len(w) else w  # mean weight 1: delta keeps its meaning
    need(len(ll), MIN_CHINCHILLA_POINTS, what)
    if np.ptp(ln) == 0:
        raise DataError(f"{what}: every point has the same N; the parametric law needs runs of several sizes")
    # With many points, the starts are scored and run on about START_POINTS evenly spaced ones and the best
    # result is refined on all of them (an L-BFGS run on 100,000 points takes seconds; the grid has 4,500 starts).
    pick = slice(None, None, max(1, len(ll) // START_POINTS))
    grid = _best_starts(_start_grid(), ln[pick], ld[pick], ll[pick], w[pick], delta, starts)
    if len(ll) > 2 * START_POINTS:
        grid = _fit_parametric_once(ln[pick], ld[pick], ll[pick], w[pick], grid, delta)[0][None]
    theta, val = _fit_parametric_once(ln, ld, ll, w, grid, delta)
    la, lb, le, a, b = theta
    pred = np.logaddexp(np.logaddexp(la - a * ln, lb - b * ld), le)
    ss_tot = float(np.sum((ll - ll.mean()) ** 2))
    r2 = 1.0 - float(np.sum((ll - pred) ** 2)) / ss_tot if ss_tot > 0 else math.nan
    fit = ParametricFit(E=math.exp(le), A=math.exp(la), B=math.exp(lb), a=float(a), b=float(b), r2=r2,
                        n_points=len(ll), huber_loss=val, resampled="points" if g is None else "runs")
    if bootstrap:
        rng = np.random.default_rng(seed)
        reps = []
        for _ in range(bootstrap):
            idx = resample_points(rng, len(ll)) if g is None else resample_groups(rng, g[keep])
            if np.ptp(ln[idx]) == 0:  # one size drawn every time: N's terms are not identified
                continue
            t, _ = _fit_parametric_once(ln[idx], ld[idx], ll[idx], w[idx], theta[None], delta)
            reps.append(t)
        if reps:
            s = np.asarray(reps)
            fit.ci = {"A": tuple(math.exp(v) for v in percentile_ci(s[:, 0])),
                      "B": tuple(math.exp(v) for v in percentile_ci(s[:, 1])),
                      "E": tuple(math.exp(v) for v in percentile_ci(s[:, 2])),
                      "a": percentile_ci(s[:, 3]), "b": percentile_ci(s[:, 4])}
    return fit


@dataclass
class ParametricPoints:
    """The points the parametric fit reads: every logged point of every run, its weight and its run."""

    params: np.ndarray
    tokens: np.ndarray
    loss: np.ndarray
    weight: np.ndarray
    run: np.ndarray  # the run's index in the curves given, one label per point


def parametric_points(curves: Sequence[Curve], min_tokens_fraction: float = 0.0,
                      weighting: str = "points") -> ParametricPoints:
    """Every finite logged point (N, D, L) of every run after its first ``min_tokens_fraction`` of tokens. None
    is dropped: an earlier version kept at most 20 log-spaced points per run, so a long run lost most of its
    data and a short one lost points where the rounded indices coincided (a run of 10 points kept 8).

    ``weighting``: ``"points"`` (the default) weighs every point alike; ``"runs"`` gives every run the same
    total weight, shared by its points. A ladder logs at a fixed token interval, so long runs hold most of the
    points, and weighting runs alike was the candidate that keeps them from deciding the fit. Measured on
    synthetic ladders (benchmarks/bench_fit_calibration.py: 6 sizes logging 10 to 1,000 points, 1 % noise, 20
    seeds), weighting points alike was the more accurate: with independent noise the largest errors of E, a
    and b were 1.9 %, 4.3 % and 1.7 % against 5.1 %, 8.3 % and 4.4 % with runs weighted alike (and 10.9 %,
    8.5 %, 5.1 % for the old 20-point selection); with noise correlated along each run the two were alike
    (13.5 / 22.2 / 8.7 % against 10.4 / 17.2 / 8.0 %). Short runs still count through the N term, which only
    they and the other sizes can pin down, and the intervals resample whole runs
    (:func:`fit_runs_parametric`), so a long run's many points do not narrow them."""
    if weighting not in ("runs", "points"):
        raise ValueError(f"weighting must be 'runs' or 'points', not {weighting!r}")
    cols: tuple[list, ...] = ([], [], [], [], [])  # N, D, L, weight, run
    for i, cv in enumerate(curves):
        for _, _, l, t in usable([cv], 1, min_tokens_fraction, min_points=1):
            share = 1.0 / len(t) if weighting == "runs" else 1.0
            for col, v in zip(cols, (np.full(len(t), cv.params), t, l, np.full(len(t), share), np.full(len(t), i))):
                col.append(v)
    return ParametricPoints(*(np.concatenate(c) if c else np.zeros(0) for c in cols))


def fit_runs_parametric(curves: Sequence[Curve], *, bootstrap: int = 200, seed: int = 0,
                        min_tokens_fraction: float = 0.0, weighting: str = "points",
                        what: str = "L(N, D)") -> ParametricFit:
    """L(N, D) fitted on every logged point of ``curves`` (:func:`parametric_points`), with intervals from
    resampling whole runs. A run's points are correlated (one initialisation, one data order), and resampling
    single points counts each of them as independent evidence: on the synthetic ladders of
    benchmarks/bench_fit_calibration.py with noise correlated along each run, the 95 % intervals from
    resampling points held the truth for 30 to 50 % of seeds, those from resampling runs for 95 to 100 %; with
    independent noise both held it for 85 to 100 %."""
    p = parametric_points(curves, min_tokens_fraction, weighting)
    return fit_parametric(p.params, p.tokens, p.loss, weights=p.weight, groups=p.run, bootstrap=bootstrap,
                          seed=seed, what=what)
