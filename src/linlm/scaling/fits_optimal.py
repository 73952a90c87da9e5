"""Several architectures compared at one compute C*, inside every one's fitted range: the loss each one's L(C)
gives there, and the optimal size and tokens there, each with its seed replicates.

C* is the geometric middle of the compute range that every architecture's envelope fit covers (no comparison
leaves the data a fit was made on). The loss at C* comes from each L(C) law and its replicates. The optimal size
at C* is read the way an IsoFLOP profile reads it (Chinchilla's approach 2), at that one compute: the size whose
mean curve is lowest at C*, a parabola in (log N, log L) through it and its two neighbours among the sizes that
reach C*, and its vertex. The step function of the envelope's N_opt(C) is not used for this: read off a few sizes
it misses a continuous optimum by up to half a size step, an error the seed replicates cannot see (on cpu-like
synthetic ladders its intervals held the true N_opt for about half the noise seeds; the parabola's for 95 %,
bench_fit_calibration.py). D_opt = C* over the FLOPs per token at N_opt (interpolated in log-log between sizes).
An optimum on the smallest or the largest size reaching C* cannot be located: "cannot tell", with the reason.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import numpy as np

from linlm.scaling.fits_bootstrap import percentile_ci
from linlm.scaling.fits_common import PFLOPS_DAY
from linlm.scaling.fits_envelope import EnvelopeFit
from linlm.scaling.fits_power import PowerLaw


def law_at(law: PowerLaw, x: float) -> tuple[float, tuple[float, float]]:
    """``law(x)`` and its 95 % interval from the law's replicates (NaN, NaN without replicates)."""
    value = float(law(x))
    if law.samples is None or len(law.samples) == 0:
        return value, (math.nan, math.nan)
    lo, hi = percentile_ci(law.samples[:, 0] + law.samples[:, 1] * math.log(x))
    return value, (math.exp(lo), math.exp(hi))


def common_compute(fits: Mapping[str, EnvelopeFit]) -> tuple[Optional[float], str]:
    """(C* in PFLOP/s-days, why there is none): the geometric middle of the compute range every fit covers."""
    if not fits:
        return None, "no architecture has an L(C) fit"
    lo = max(f.compute_range[0] for f in fits.values())
    hi = min(f.compute_range[1] for f in fits.values())
    if lo > hi:
        return None, (f"the fitted compute ranges do not overlap (the highest start {lo:.3g} is above the lowest "
                      f"end {hi:.3g} PFLOP/s-days)")
    return math.sqrt(lo * hi), ""


def optimum_at(rows: Sequence[tuple], c_flops: float) -> tuple[Optional[float], Optional[float], str]:
    """(N_opt, D_opt, why not) at the compute ``c_flops`` from size rows (curve, compute, loss, tokens)."""
    pts = []
    for cv, compute, loss, _ in rows:
        if compute.min() <= c_flops <= compute.max():
            y = float(np.interp(math.log(c_flops), np.log(compute), np.log(loss)))
            pts.append((math.log(cv.params), y, math.log(cv.paper_flops_per_token)))
    pts.sort()
    if len(pts) < 3:
        return None, None, f"{len(pts)} size(s) reach this compute; 3 are needed to locate the optimum"
    k = int(np.argmin([p[1] for p in pts]))
    if k in (0, len(pts) - 1):
        edge = "smallest" if k == 0 else "largest"
        return None, None, (f"the lowest loss at this compute is the {edge} size reaching it "
                            f"({math.exp(pts[k][0]):,.0f} parameters): the optimum lies outside the sampled sizes")
    xs, ys, fs = zip(*pts[k - 1:k + 2])
    c2, c1, _ = np.polyfit(xs, ys, 2)
    x = -c1 / (2 * c2) if c2 > 0 else xs[1]
    x = float(min(max(x, xs[0]), xs[2]))  # a vertex outside the three sizes (noise): their edge
    log_fpt = float(np.interp(x, [p[0] for p in pts], [p[2] for p in pts]))
    return math.exp(x), c_flops / math.exp(log_fpt), ""


def _interval(values: list[float]) -> list[float]:
    lo, hi = percentile_ci(np.log(values)) if values else (math.nan, math.nan)
    return [math.exp(lo), math.exp(hi)] if values else [math.nan, math.nan]


def compute_optimal(fits: Mapping[str, EnvelopeFit]) -> dict:
    """``{"compute_pflops_days": C*, "why": ..., "archs": {arch: row}}``: each architecture's loss from its L(C)
    at C* and the optimal N and D there (module doc), each with its 95 % interval and its replicates (kept so that
    a comparison can be computed again from the file), the number of replicates that could not locate the
    optimum, or why none could be read."""
    c, why = common_compute(fits)
    rows: dict[str, dict] = {}
    if c is None:
        return {"compute_pflops_days": None, "why": why, "archs": rows}
    for arch, f in fits.items():
        loss = f.loss
        samples = ([] if loss.samples is None else
                   [math.exp(a + b * math.log(c)) for a, b in loss.samples])
        n_opt, d_opt, not_here = optimum_at([s.row() for s in f.sizes], c * PFLOPS_DAY)
        row = {"loss": float(loss(c)), "loss_ci": _interval(samples), "loss_samples": _rounded(samples),
               "N_opt": n_opt, "D_opt": d_opt, "why": not_here or None}
        if n_opt is not None:
            ns, ds, failed = [], [], 0
            for rep in f.replicate_rows():
                n, d, _ = optimum_at(rep, c * PFLOPS_DAY)
                if n is None:
                    failed += 1
                else:
                    ns.append(n)
                    ds.append(d)
            row.update({"N_opt_ci": _interval(ns), "D_opt_ci": _interval(ds), "N_opt_samples": _rounded(ns),
                        "D_opt_samples": _rounded(ds), "failed": failed})
        rows[arch] = row
    return {"compute_pflops_days": c, "why": None, "archs": rows}


def _rounded(values: list[float]) -> list[float]:
    return [float(f"{v:.7g}") for v in values]
