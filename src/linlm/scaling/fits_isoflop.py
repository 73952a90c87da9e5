"""IsoFLOP profiles (Chinchilla approach 2) and the N_opt(C), D_opt(C) laws read from their minima.

At each of several compute levels, every run that reaches it contributes its (interpolated) loss; a parabola in
log N through those points has its minimum at N_opt(C). With one learning rate schedule per run this reads
intermediate points of a run, not a run tuned to end at C (see docs/scaling.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np

from linlm.scaling.fits_common import PFLOPS_DAY, Curve, interp_log, need, usable
from linlm.scaling.fits_power import MIN_POWER_LAW_POINTS, PowerLaw, fit_power_law

MIN_ISOFLOP_RUNS = 3


@dataclass
class IsoFlopProfile:
    compute: float  # FLOPs
    params: list[float]
    loss: list[float]
    parabola: Optional[list[float]]  # coefficients of loss = p0 (log N)^2 + p1 log N + p2
    n_opt: Optional[float]
    interior: bool  # the parabola's minimum lies inside the sampled sizes


@dataclass
class IsoFlopFit:
    profiles: list[IsoFlopProfile]
    params: Optional[PowerLaw]  # N_opt(C), C in PFLOP/s-days
    tokens: Optional[PowerLaw]  # D_opt(C)

    def to_dict(self) -> dict:
        return {"profiles": [{**asdict(p), "compute_pflops_days": p.compute / PFLOPS_DAY} for p in self.profiles],
                "N_opt(C)": self.params.to_dict() if self.params else None,
                "D_opt(C)": self.tokens.to_dict() if self.tokens else None}


def isoflop(curves: Sequence[Curve], *, levels: int = 8, smooth_window: int = 1, bootstrap: int = 1000,
            seed: int = 0, min_tokens_fraction: float = 0.0, what: str = "IsoFLOP") -> IsoFlopFit:
    """Profiles at ``levels`` log-spaced compute values where at least 3 runs of different sizes meet."""
    runs = [(cv, c, l) for cv, c, l, _ in usable(curves, smooth_window, min_tokens_fraction)]
    need(len({cv.params for cv, _, _ in runs}), MIN_ISOFLOP_RUNS, f"{what} (runs of different sizes)")
    lo = min(c.min() for _, c, _ in runs)
    hi = max(c.max() for _, c, _ in runs)
    profiles = []
    for level in np.geomspace(lo, hi, levels + 2)[1:-1]:
        pts = [(cv.params, float(interp_log(np.array([level]), c, l)[0])) for cv, c, l in runs]
        pts = sorted((n, l) for n, l in pts if np.isfinite(l))
        if len({n for n, _ in pts}) < MIN_ISOFLOP_RUNS:
            continue
        x = np.log([n for n, _ in pts])
        y = np.array([l for _, l in pts])
        p = np.polyfit(x, y, 2)
        n_opt, interior = None, False
        if p[0] > 0:
            v = -p[1] / (2 * p[0])
            n_opt, interior = float(math.exp(v)), bool(x.min() < v < x.max())
        profiles.append(IsoFlopProfile(float(level), [float(n) for n, _ in pts], y.tolist(), p.tolist(), n_opt,
                                       interior))
    inside = [p for p in profiles if p.interior]
    n_law = d_law = None
    if len(inside) >= MIN_POWER_LAW_POINTS:
        c = np.array([p.compute for p in inside])
        n = np.array([p.n_opt for p in inside])
        # D_opt = C / (FLOPs per token at N_opt), the FLOPs per token interpolated log-log across the runs.
        sizes = sorted({(cv.params, cv.paper_flops_per_token) for cv, _, _ in runs})
        fpt = np.exp(np.interp(np.log(n), np.log([s[0] for s in sizes]), np.log([s[1] for s in sizes])))
        kw = dict(bootstrap=bootstrap, seed=seed)
        n_law = fit_power_law(c / PFLOPS_DAY, n, what=f"{what}: N_opt(C)", **kw)
        d_law = fit_power_law(c / PFLOPS_DAY, c / fpt, what=f"{what}: D_opt(C)", **kw)
    return IsoFlopFit(profiles, n_law, d_law)
