"""What every scaling-law fit shares: the unit of compute, a run's loss curve, its smoothing, the check that enough
points exist, and which logged points of each run the fits read.

Units. Compute ``C`` is in FLOPs inside the fits (the library's counters: training FLOPs per token x tokens); the
report and the paper's coefficients use PFLOP/s-days, ``C / PFLOPS_DAY``. ``N`` is non-embedding parameters
(active ones for mixtures of experts), ``D`` training tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from linlm.errors import DataError

PFLOPS_DAY = 1e15 * 86400.0
"""FLOPs in one PFLOP/s-day."""


@dataclass
class Curve:
    """One training run as the fits see it: the loss after each logged number of tokens."""

    name: str
    arch: str
    params: float  # non-embedding (active) parameters N
    paper_flops_per_token: float  # training FLOPs per token, paper convention (linlm.models.cost)
    tokens: np.ndarray
    loss: np.ndarray
    seed: Optional[int] = None  # the train config's seed: runs of one size differ by it (linlm.scaling.fits_seeds)

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.float64)
        self.loss = np.asarray(self.loss, dtype=np.float64)

    @property
    def compute(self) -> np.ndarray:
        return self.tokens * self.paper_flops_per_token


def smooth(loss: np.ndarray, window: int, tokens: Optional[np.ndarray] = None) -> np.ndarray:
    """The loss at each logged point from a straight line fitted through the ``window`` points around it in
    (log tokens, log loss) (fewer at the ends); window <= 1 leaves the curve as it is.

    A training curve falls steeply at first. A mean of neighbouring losses there sits above the curve (it is
    convex), and logged at fixed token intervals the first points span a large ratio of tokens: on cpu-like
    synthetic ladders a 5-point mean put the optimal size read at a fixed compute up to 0.26 in log N off, and
    the L(C) intervals missed the truth for it. A line in log-log space follows a power law exactly, so it
    removes noise without that bias (bench_fit_calibration.py). Without ``tokens`` the points are taken as
    evenly spaced in log tokens."""
    if window <= 1 or len(loss) < 3:
        return loss
    x = np.log(tokens) if tokens is not None else np.arange(len(loss), dtype=np.float64)
    y = np.log(loss)
    half = window // 2
    out = np.empty_like(y)
    for i in range(len(y)):
        lo, hi = max(0, i - half), min(len(y), i + half + 1)
        xs, ys = x[lo:hi], y[lo:hi]
        xm = xs.mean()
        sxx = float(((xs - xm) ** 2).sum())
        slope = float(((xs - xm) * (ys - ys.mean())).sum()) / sxx if sxx > 0 else 0.0
        out[i] = ys.mean() + slope * (x[i] - xm)
    return np.exp(out)


def need(n: int, needed: int, what: str) -> None:
    """DataError unless ``n`` usable points reach ``needed``."""
    if n < needed:
        raise DataError(f"{what}: {n} usable point{'s' if n != 1 else ''}, at least {needed} are needed; "
                        "train more runs (or longer ones) so that more points exist")


def usable(curves: Sequence[Curve], smooth_window: int, min_tokens_fraction: float, min_points: int = 2):
    """(curve, compute, smoothed loss, tokens) of each curve's finite points after its first
    ``min_tokens_fraction`` of tokens; curves with fewer than ``min_points`` such points are left out."""
    out = []
    for cv in curves:
        keep = np.isfinite(cv.loss) & (cv.tokens > 0)
        if min_tokens_fraction > 0 and keep.any():
            keep &= cv.tokens >= min_tokens_fraction * cv.tokens[keep].max()
        if keep.sum() >= min_points:
            out.append((cv, cv.compute[keep], smooth(cv.loss[keep], smooth_window, cv.tokens[keep]),
                        cv.tokens[keep]))
    return out


def interp_log(c_grid: np.ndarray, c: np.ndarray, v: np.ndarray) -> np.ndarray:
    """v interpolated linearly in log c at c_grid; NaN outside the run's range."""
    return np.interp(np.log(c_grid), np.log(c), v, left=np.nan, right=np.nan)
