"""The compute-optimal envelope (the paper's method, Chinchilla approach 1) and the laws fitted on it: L(C),
N_opt(C) and D_opt(C).

Every run logs its training loss at fixed token intervals; for each compute value the envelope takes the lowest
loss over all runs of an architecture (each run's curve interpolated linearly in log C), remembers which run gave
it (its N) and how many tokens that run had seen at that compute (D). Then ``L = beta C^alpha``,
``N_opt = beta C^alpha`` and ``D_opt = beta C^alpha`` are each a straight line in log-log space, fitted by least
squares (:mod:`linlm.scaling.fits_power`). The paper has no irreducible term.

L(C)'s interval resamples the envelope's points; those of N_opt(C) and D_opt(C) resample whole runs
(:func:`fit_envelope` says why).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from linlm.errors import DataError
from linlm.scaling.fits_bootstrap import resample_points
from linlm.scaling.fits_common import PFLOPS_DAY, Curve, interp_log, need, usable
from linlm.scaling.fits_power import MIN_POWER_LAW_POINTS, PowerLaw, fit_power_law, set_samples


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
    """L(C), N_opt(C) and D_opt(C) fitted on an envelope, C in PFLOP/s-days. N_opt and D_opt are None when the
    fitted points all lie on one size (then N_opt is flat by construction and says nothing). ``resampled`` says
    what the bootstrap of N_opt and D_opt drew (``runs`` or ``points``); ``replicates`` how many resamples gave
    both laws, ``failed`` how many gave too few envelope points for them (those are left out of the intervals)."""

    loss: PowerLaw
    params: Optional[PowerLaw]
    tokens: Optional[PowerLaw]
    envelope: Envelope
    resampled: str = "runs"
    replicates: int = 0
    failed: int = 0

    def to_dict(self) -> dict:
        e = self.envelope
        return {"L(C)": self.loss.to_dict(), "N_opt(C)": self.params.to_dict() if self.params else None,
                "D_opt(C)": self.tokens.to_dict() if self.tokens else None,
                "optimum_bootstrap": {"resampled": self.resampled, "replicates": self.replicates,
                                      "failed": self.failed},
                "envelope": {"compute_pflops_days": (e.compute / PFLOPS_DAY).tolist(), "loss": e.loss.tolist(),
                             "params": e.params.tolist(), "tokens": e.tokens.tolist(), "run": e.run}}


def _laws(env: Envelope, interior_only: bool, what: str, sizes: int, loss_bootstrap: int, optimum_bootstrap: int,
          seed: int):
    """(L, N_opt, D_opt) fitted on ``env``, each with its own number of point resamples; N_opt and D_opt None
    when the fitted points lie on one size."""
    use = env.interior if interior_only else np.ones(len(env.compute), dtype=bool)
    if interior_only and use.sum() < MIN_POWER_LAW_POINTS:
        raise DataError(f"{what}: only {int(use.sum())} envelope point(s) lie on a size other than the smallest or "
                        f"largest of the {sizes} size(s); at least {MIN_POWER_LAW_POINTS} are needed. Train at "
                        "least 3 sizes whose loss curves overtake one another (larger sizes, or longer runs)")
    c = env.compute[use] / PFLOPS_DAY
    loss = fit_power_law(c, env.loss[use], what=f"{what}: L(C)", bootstrap=loss_bootstrap, seed=seed)
    if len(set(env.params[use].tolist())) < 2:
        return loss, None, None
    kw = dict(bootstrap=optimum_bootstrap, seed=seed)
    return (loss, fit_power_law(c, env.params[use], what=f"{what}: N_opt(C)", **kw),
            fit_power_law(c, env.tokens[use], what=f"{what}: D_opt(C)", **kw))


def fit_envelope(curves: Sequence[Curve], *, points: int = 60, smooth_window: int = 1,
                 min_tokens_fraction: float = 0.0, bootstrap: int = 1000, seed: int = 0,
                 interior_only: bool = True, resample: str = "runs", what: str = "envelope") -> EnvelopeFit:
    """Power laws fitted on the envelope's interior points (all points when ``interior_only`` is False), each
    with ``bootstrap`` resamples for its intervals.

    L(C) resamples the envelope's points. N_opt(C) and D_opt(C) (``resample``): ``"runs"`` (the default) draws
    the runs with replacement, takes the envelope of the runs drawn and fits both laws again; ``"points"`` draws
    the envelope's points, as L(C) does. N_opt is a step function of the sizes trained, read at ``points`` grid
    values, so its points are not independent measurements and an interval from resampling them shrinks as the
    grid is made finer, with no new data: on synthetic ladders of 6 and 10 sizes (1 % noise, 20 seeds) it held
    the true exponent for 95 % of seeds at 60 grid points and for 5 % (6 sizes) or 50 % (10 sizes) at 240.
    Resampling runs gives intervals that do not depend on the grid and held the truth for every seed, and that
    are wide (about 1.0 in the exponent for 6 sizes, 0.2 for 10): they include the error of reading a
    continuous optimum off a few sizes, which dominates a small ladder."""
    if resample not in ("runs", "points"):
        raise ValueError(f"resample must be 'runs' or 'points', not {resample!r}")
    runs = usable(curves, smooth_window, min_tokens_fraction)
    env = envelope_of(runs, points)
    sizes = len({cv.params for cv in curves})
    by_points = bootstrap if resample == "points" else 0
    loss, n_law, d_law = _laws(env, interior_only, what, sizes, bootstrap, by_points, seed)
    fit = EnvelopeFit(loss, n_law, d_law, env, resample, by_points)
    if resample == "runs" and bootstrap and n_law is not None:
        rng = np.random.default_rng(seed)
        reps = np.full((bootstrap, 2, 2), np.nan)  # replicate, (N_opt, D_opt), (log beta, alpha)
        for k in range(bootstrap):
            drawn = [runs[i] for i in resample_points(rng, len(runs))]
            try:
                _, n_b, d_b = _laws(envelope_of(drawn, points), interior_only, what, sizes, 0, 0, seed)
            except DataError:
                continue
            if n_b is not None:
                reps[k] = [(math.log(n_b.beta), n_b.alpha), (math.log(d_b.beta), d_b.alpha)]
        done = np.isfinite(reps).all(axis=(1, 2))
        fit.replicates, fit.failed = int(done.sum()), int(bootstrap - done.sum())
        set_samples(n_law, reps[done, 0])
        set_samples(d_law, reps[done, 1])
    return fit
