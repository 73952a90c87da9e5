"""Bootstrap intervals for the scaling-law fits: the resampling and the percentile interval.

Two resampling units. ``resample_points`` draws single points with replacement: right when the points are
independent draws (the envelope's power laws, the IsoFLOP optima). ``resample_groups`` draws whole groups (runs)
with replacement and keeps every point of each drawn run: right when points within a group are correlated, as the
logged losses of one training run are (one initialisation, one data order, a smoothed curve), so that resampling
single points would treat hundreds of correlated points as independent and give intervals far too narrow.
Intervals are percentile intervals at 95 %.
"""

from __future__ import annotations

import math

import numpy as np

LEVEL = 0.95


def percentile_ci(values: np.ndarray) -> tuple[float, float]:
    """The central 95 % interval of the finite ``values`` (NaN, NaN when none is finite)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return (math.nan, math.nan)
    tail = 50.0 * (1.0 - LEVEL)
    lo, hi = np.percentile(values, [tail, 100.0 - tail])
    return (float(lo), float(hi))


def resample_points(rng: np.random.Generator, n: int) -> np.ndarray:
    """Indices of ``n`` points drawn with replacement."""
    return rng.integers(0, n, n)


def resample_groups(rng: np.random.Generator, groups: np.ndarray) -> np.ndarray:
    """Indices of every point of ``len(unique(groups))`` groups drawn with replacement (a group drawn twice
    contributes its points twice)."""
    labels, inverse = np.unique(groups, return_inverse=True)
    members = [np.flatnonzero(inverse == k) for k in range(len(labels))]
    drawn = rng.integers(0, len(labels), len(labels))
    return np.concatenate([members[k] for k in drawn])
