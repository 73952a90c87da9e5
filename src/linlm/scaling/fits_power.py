"""Power laws ``y = beta x^alpha`` fitted by least squares in log-log space, with bootstrap intervals (points
resampled), and the compute at which two fitted laws L(C) cross."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np

from linlm.errors import DataError
from linlm.scaling.fits_bootstrap import percentile_ci, resample_points
from linlm.scaling.fits_common import need

MIN_POWER_LAW_POINTS = 3


@dataclass
class PowerLaw:
    """y = beta * x^alpha, fitted in log space, with 95 % bootstrap intervals and R^2 (log-log)."""

    beta: float
    alpha: float
    r2: float
    n_points: int
    beta_ci: tuple[float, float] = (math.nan, math.nan)
    alpha_ci: tuple[float, float] = (math.nan, math.nan)
    # Bootstrap replicates (log beta, alpha), kept for derived quantities such as a crossover's interval.
    samples: Optional[np.ndarray] = field(default=None, repr=False)

    def __call__(self, x):
        return self.beta * np.asarray(x, dtype=np.float64) ** self.alpha

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("samples")
        d["beta_ci"], d["alpha_ci"] = list(self.beta_ci), list(self.alpha_ci)
        return d


def set_samples(law: PowerLaw, samples: np.ndarray) -> PowerLaw:
    """Give ``law`` its bootstrap replicates (rows of log beta, alpha; NaN rows are failed replicates) and the
    95 % percentile intervals they imply."""
    law.samples = samples
    lo, hi = percentile_ci(samples[:, 0])
    law.beta_ci = (math.exp(lo), math.exp(hi))
    law.alpha_ci = percentile_ci(samples[:, 1])
    return law


def line(lx: np.ndarray, ly: np.ndarray) -> tuple[float, float, float]:
    """Least squares ly = a + b lx; returns (a, b, R^2)."""
    b, a = np.polyfit(lx, ly, 1)
    resid = ly - (a + b * lx)
    ss_tot = float(np.sum((ly - ly.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid ** 2)) / ss_tot if ss_tot > 0 else math.nan
    return float(a), float(b), r2


def fit_power_law(x: Sequence[float], y: Sequence[float], *, bootstrap: int = 1000, seed: int = 0,
                  what: str = "power law") -> PowerLaw:
    """Fit y = beta x^alpha by least squares on (log x, log y); bootstrap the points for intervals."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    lx, ly = np.log(x[keep]), np.log(y[keep])
    need(len(lx), MIN_POWER_LAW_POINTS, what)
    if np.ptp(lx) == 0:
        raise DataError(f"{what}: every point has the same x ({math.exp(lx[0]):.4g}); a power law needs a range")
    a, b, r2 = line(lx, ly)
    law = PowerLaw(beta=math.exp(a), alpha=b, r2=r2, n_points=len(lx))
    if bootstrap:
        rng = np.random.default_rng(seed)
        reps = []
        n = len(lx)
        for _ in range(bootstrap):
            idx = resample_points(rng, n)
            if np.ptp(lx[idx]) == 0:
                continue
            bb, aa = np.polyfit(lx[idx], ly[idx], 1)
            reps.append((aa, bb))
        if reps:
            set_samples(law, np.asarray(reps))
    return law


# ---- crossover --------------------------------------------------------------------------------------------


def crossover(a: PowerLaw, b: PowerLaw) -> Optional[float]:
    """The x where beta_a x^alpha_a = beta_b x^alpha_b, or None for parallel laws (or a crossing beyond 1e304)."""
    if a.alpha == b.alpha:
        return None
    log_x = (math.log(b.beta) - math.log(a.beta)) / (a.alpha - b.alpha)
    return math.exp(log_x) if abs(log_x) < 700 else None  # beyond float range: as good as parallel


@dataclass
class Crossover:
    """Where two fitted L(C) cross (C in the laws' unit), which side is lower beyond it, and a bootstrap interval."""

    a: str
    b: str
    compute: Optional[float]
    ci: tuple[float, float]
    lower_after: Optional[str]  # the architecture with the lower loss at compute above the crossover

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "compute_pflops_days": self.compute, "ci": list(self.ci),
                "lower_after": self.lower_after}


def crossover_between(name_a: str, a: PowerLaw, name_b: str, b: PowerLaw) -> Crossover:
    x = crossover(a, b)
    lower = None
    if x is not None:  # a steeper (more negative) exponent wins beyond the crossing
        lower = name_a if a.alpha < b.alpha else name_b
    ci = (math.nan, math.nan)
    if a.samples is not None and b.samples is not None:
        m = min(len(a.samples), len(b.samples))
        la, aa = a.samples[:m, 0], a.samples[:m, 1]
        lb, ab = b.samples[:m, 0], b.samples[:m, 1]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            logs = (lb - la) / (aa - ab)
        lo, hi = percentile_ci(logs)
        if math.isfinite(lo) and math.isfinite(hi):
            ci = (math.exp(max(min(lo, 700), -700)), math.exp(max(min(hi, 700), -700)))
    return Crossover(name_a, name_b, x, ci, lower)
