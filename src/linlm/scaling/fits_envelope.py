"""The compute-optimal envelope (the paper's method, Chinchilla approach 1) and the laws fitted on it: L(C),
N_opt(C) and D_opt(C).

Every run logs its training loss at fixed token intervals; for each compute value the envelope takes the lowest
loss over all runs of an architecture (each run's curve interpolated linearly in log C), remembers which run gave
it (its N) and how many tokens that run had seen at that compute (D). Then ``L = beta C^alpha``,
``N_opt = beta C^alpha`` and ``D_opt = beta C^alpha`` are each a straight line in log-log space, fitted by least
squares (:mod:`linlm.scaling.fits_power`). The paper has no irreducible term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from linlm.errors import DataError
from linlm.scaling.fits_common import PFLOPS_DAY, Curve, interp_log, need, usable
from linlm.scaling.fits_power import MIN_POWER_LAW_POINTS, PowerLaw, fit_power_law


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
    runs = usable(curves, smooth_window, min_tokens_fraction)
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
    """L(C), N_opt(C) and D_opt(C) fitted on an envelope, C in PFLOP/s-days. N_opt and D_opt are None when the
    fitted points all lie on one size (then N_opt is flat by construction and says nothing)."""

    loss: PowerLaw
    params: Optional[PowerLaw]
    tokens: Optional[PowerLaw]
    envelope: Envelope

    def to_dict(self) -> dict:
        e = self.envelope
        return {"L(C)": self.loss.to_dict(), "N_opt(C)": self.params.to_dict() if self.params else None,
                "D_opt(C)": self.tokens.to_dict() if self.tokens else None,
                "envelope": {"compute_pflops_days": (e.compute / PFLOPS_DAY).tolist(), "loss": e.loss.tolist(),
                             "params": e.params.tolist(), "tokens": e.tokens.tolist(), "run": e.run}}


def fit_envelope(curves: Sequence[Curve], *, points: int = 60, smooth_window: int = 1,
                 min_tokens_fraction: float = 0.0, bootstrap: int = 1000, seed: int = 0,
                 interior_only: bool = True, what: str = "envelope") -> EnvelopeFit:
    """Power laws fitted on the envelope's interior points (all points when ``interior_only`` is False)."""
    env = envelope(curves, points=points, smooth_window=smooth_window, min_tokens_fraction=min_tokens_fraction)
    use = env.interior if interior_only else np.ones(len(env.compute), dtype=bool)
    if interior_only and use.sum() < MIN_POWER_LAW_POINTS:
        sizes = len({cv.params for cv in curves})
        raise DataError(f"{what}: only {int(use.sum())} envelope point(s) lie on a size other than the smallest or "
                        f"largest of the {sizes} size(s); at least {MIN_POWER_LAW_POINTS} are needed. Train at "
                        "least 3 sizes whose loss curves overtake one another (larger sizes, or longer runs)")
    c = env.compute[use] / PFLOPS_DAY
    kw = dict(bootstrap=bootstrap, seed=seed)
    loss = fit_power_law(c, env.loss[use], what=f"{what}: L(C)", **kw)
    if len(set(env.params[use].tolist())) < 2:
        return EnvelopeFit(loss=loss, params=None, tokens=None, envelope=env)
    return EnvelopeFit(loss=loss, params=fit_power_law(c, env.params[use], what=f"{what}: N_opt(C)", **kw),
                       tokens=fit_power_law(c, env.tokens[use], what=f"{what}: D_opt(C)", **kw), envelope=env)
