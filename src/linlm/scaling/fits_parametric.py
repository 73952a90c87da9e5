"""Chinchilla's parametric law L(N, D) = E + A / N^a + B / D^b (Hoffmann et al. 2022, approach 3).

Fitted as Hoffmann et al. do: in log space, ``log L_hat = logsumexp(log A - a log N, log B - b log D, log E)``,
with a Huber loss (delta 1e-3) on ``log L_hat - log L``, minimised by L-BFGS (scipy) from the best points of a
grid of starts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from linlm.errors import DataError
from linlm.scaling.fits_bootstrap import percentile_ci, resample_points
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


def _huber(r: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Huber values and derivatives."""
    small = np.abs(r) <= delta
    val = np.where(small, 0.5 * r * r, delta * (np.abs(r) - 0.5 * delta))
    grad = np.where(small, r, delta * np.sign(r))
    return val, grad


def _parametric_objective(theta: np.ndarray, ln: np.ndarray, ld: np.ndarray, ll: np.ndarray, delta: float):
    """Huber loss of log L_hat - log L and its gradient; theta = (log A, log B, log E, a, b)."""
    la, lb, le, a, b = theta
    terms = np.stack([la - a * ln, lb - b * ld, np.full_like(ln, le)])
    m = terms.max(axis=0)
    w = np.exp(terms - m)
    s = w.sum(axis=0)
    pred = m + np.log(s)
    w /= s
    val, g = _huber(pred - ll, delta)
    grad = np.array([np.sum(g * w[0]), np.sum(g * w[1]), np.sum(g * w[2]),
                     np.sum(g * w[0] * -ln), np.sum(g * w[1] * -ld)])
    return float(val.sum()), grad


def _start_grid() -> np.ndarray:
    """Hoffmann et al.'s grid of initialisations (log A, log B in 0..25; log E in -1..1; a, b in 0..2)."""
    la = np.arange(0.0, 26.0, 5.0)
    le = np.arange(-1.0, 1.01, 0.5)
    ab = np.arange(0.0, 2.01, 0.5)
    g = np.stack(np.meshgrid(la, la, le, ab, ab, indexing="ij"), axis=-1).reshape(-1, 5)
    return g


def _best_starts(grid: np.ndarray, ln, ld, ll, delta: float, k: int) -> np.ndarray:
    """The k grid points with the lowest objective (evaluated in one vectorised pass)."""
    la, lb, le, a, b = (grid[:, i : i + 1] for i in range(5))
    terms = np.stack([la - a * ln[None], lb - b * ld[None], np.broadcast_to(le, (len(grid), len(ln)))])
    m = terms.max(axis=0)
    pred = m + np.log(np.exp(terms - m).sum(axis=0))
    val, _ = _huber(pred - ll[None], delta)
    return grid[np.argsort(val.sum(axis=1))[:k]]


def _fit_parametric_once(ln, ld, ll, starts: np.ndarray, delta: float) -> tuple[np.ndarray, float]:
    from scipy.optimize import minimize

    best, best_val = None, math.inf
    # log A, log B within Hoffmann et al.'s range and a margin; log E below 10 nats; exponents in [0, 5].
    bounds = [(-30.0, 60.0), (-30.0, 60.0), (-20.0, 2.5), (0.0, 5.0), (0.0, 5.0)]
    for x0 in starts:
        res = minimize(_parametric_objective, x0, args=(ln, ld, ll, delta), jac=True, method="L-BFGS-B",
                       bounds=bounds, options={"maxiter": 500, "ftol": 1e-14, "gtol": 1e-10})
        if res.fun < best_val:
            best, best_val = res.x, float(res.fun)
    return best, best_val


def fit_parametric(params: Sequence[float], tokens: Sequence[float], loss: Sequence[float], *,
                   bootstrap: int = 200, seed: int = 0, starts: int = 8, delta: float = HUBER_DELTA,
                   what: str = "L(N, D)") -> ParametricFit:
    n = np.asarray(params, dtype=np.float64)
    d = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(loss, dtype=np.float64)
    keep = np.isfinite(n) & np.isfinite(d) & np.isfinite(y) & (n > 0) & (d > 0) & (y > 0)
    ln, ld, ll = np.log(n[keep]), np.log(d[keep]), np.log(y[keep])
    need(len(ll), MIN_CHINCHILLA_POINTS, what)
    if np.ptp(ln) == 0:
        raise DataError(f"{what}: every point has the same N; the parametric law needs runs of several sizes")
    grid = _best_starts(_start_grid(), ln, ld, ll, delta, starts)
    theta, val = _fit_parametric_once(ln, ld, ll, grid, delta)
    la, lb, le, a, b = theta
    pred = np.logaddexp(np.logaddexp(la - a * ln, lb - b * ld), le)
    ss_tot = float(np.sum((ll - ll.mean()) ** 2))
    r2 = 1.0 - float(np.sum((ll - pred) ** 2)) / ss_tot if ss_tot > 0 else math.nan
    fit = ParametricFit(E=math.exp(le), A=math.exp(la), B=math.exp(lb), a=float(a), b=float(b), r2=r2,
                        n_points=len(ll), huber_loss=val)
    if bootstrap:
        rng = np.random.default_rng(seed)
        reps = []
        starts_b = theta[None]  # each resample starts from the full-data optimum
        for _ in range(bootstrap):
            idx = resample_points(rng, len(ll))
            t, _ = _fit_parametric_once(ln[idx], ld[idx], ll[idx], starts_b, delta)
            reps.append(t)
        s = np.asarray(reps)
        fit.ci = {"A": tuple(math.exp(v) for v in percentile_ci(s[:, 0])),
                  "B": tuple(math.exp(v) for v in percentile_ci(s[:, 1])),
                  "E": tuple(math.exp(v) for v in percentile_ci(s[:, 2])),
                  "a": percentile_ci(s[:, 3]), "b": percentile_ci(s[:, 4])}
    return fit


def parametric_points(curves: Sequence[Curve], per_run: int = 20,
                      min_tokens_fraction: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N, D, L) points for the parametric fit: up to ``per_run`` log-spaced logged points of each run."""
    ns, ds, ls = [], [], []
    for cv, _, l, t in usable(curves, 1, min_tokens_fraction, min_points=1):
        idx = np.unique(np.round(np.geomspace(1, len(t), min(per_run, len(t)))).astype(int) - 1)
        ns.append(np.full(len(idx), cv.params))
        ds.append(t[idx])
        ls.append(l[idx])
    if not ns:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    return np.concatenate(ns), np.concatenate(ds), np.concatenate(ls)
