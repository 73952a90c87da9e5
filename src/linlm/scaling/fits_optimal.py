"""The compute-optimal allocation of several architectures compared at one compute: each one's N_opt(C) and
D_opt(C) (:func:`linlm.scaling.fits_envelope.fit_envelope`) read at a compute they all reach, with 95 % intervals
from the laws' bootstrap replicates, beside what the paper's coefficients give there.

A law's interval at a compute comes from its replicates (log beta, alpha) evaluated there, not from the
separate intervals of beta and alpha, which are strongly correlated.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

from linlm.scaling.fits_bootstrap import percentile_ci
from linlm.scaling.fits_common import PFLOPS_DAY
from linlm.scaling.fits_envelope import EnvelopeFit
from linlm.scaling.fits_power import PowerLaw


def law_at(law: PowerLaw, x: float) -> tuple[float, tuple[float, float]]:
    """``law(x)`` and its 95 % interval from the law's bootstrap replicates (NaN, NaN without replicates)."""
    value = float(law(x))
    if law.samples is None or len(law.samples) == 0:
        return value, (math.nan, math.nan)
    lo, hi = percentile_ci(law.samples[:, 0] + law.samples[:, 1] * math.log(x))
    return value, (math.exp(lo), math.exp(hi))


def common_compute(fits: Mapping[str, EnvelopeFit]) -> Optional[float]:
    """The compute (PFLOP/s-days) where the architectures are compared: the lowest, over those with an N_opt(C)
    law, of the largest compute their law was fitted on. None when none has one."""
    tops = [float(f.envelope.compute[f.envelope.interior].max()) / PFLOPS_DAY for f in fits.values()
            if f.params is not None]
    return min(tops) if tops else None


def compute_optimal(fits: Mapping[str, EnvelopeFit], paper: Mapping[str, Mapping[str, tuple[float, float]]]) -> dict:
    """``{"compute_pflops_days": C, "archs": {arch: row}}``: for every architecture with N_opt(C) and D_opt(C)
    laws, ``row`` holds ``N_opt`` and ``D_opt`` at C with their intervals (``N_opt_ci``, ``D_opt_ci``) and the
    paper's values at C (``paper_N_opt``, ``paper_D_opt``; None for an architecture the paper did not fit).
    ``paper`` maps an architecture to its ``{"N_opt(C)": (beta, alpha), "D_opt(C)": ...}``."""
    c = common_compute(fits)
    rows: dict[str, dict] = {}
    for arch, f in fits.items():
        if c is None or f.params is None or f.tokens is None:
            continue
        row: dict = {}
        for key, law in (("N_opt", f.params), ("D_opt", f.tokens)):
            value, ci = law_at(law, c)
            published = paper.get(arch, {}).get(f"{key}(C)")
            row.update({key: value, f"{key}_ci": list(ci),
                        f"paper_{key}": None if published is None else published[0] * c ** published[1]})
        rows[arch] = row
    return {"compute_pflops_days": c, "archs": rows}
