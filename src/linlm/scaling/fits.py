"""Scaling-law fits, one module per algorithm; this module gathers their public names so that callers import them
from one place.

- :mod:`linlm.scaling.fits_common`: units (``PFLOPS_DAY``), a run's loss curve (``Curve``), smoothing, which
  logged points each run gives the fits.
- :mod:`linlm.scaling.fits_power`: power laws ``y = beta x^alpha`` in log-log space (``fit_power_law``) and where two
  fitted L(C) cross (``crossover``, ``crossover_between``).
- :mod:`linlm.scaling.fits_seeds`: runs of one size as seeds, the seed spread, and the seed replicates every
  envelope fit's intervals come from.
- :mod:`linlm.scaling.fits_envelope`: the compute-optimal envelope (the paper's method, Chinchilla approach 1) and
  L(C), N_opt(C), D_opt(C) fitted on it.
- :mod:`linlm.scaling.fits_optimal`: several architectures at one compute inside every fitted range: the loss,
  N_opt and D_opt there, with their replicates.
- :mod:`linlm.scaling.fits_isoflop`: IsoFLOP profiles (approach 2).
- :mod:`linlm.scaling.fits_parametric`: Chinchilla's parametric law L(N, D) = E + A/N^a + B/D^b (approach 3).
- :mod:`linlm.scaling.fits_bootstrap`: the bootstrap's resampling and percentile intervals.

R^2 is measured in the space a law is fitted in (log-log; log L for the parametric law).
"""

from __future__ import annotations

from linlm.scaling.fits_bootstrap import percentile_ci, resample_groups, resample_points
from linlm.scaling.fits_common import PFLOPS_DAY, Curve, smooth
from linlm.scaling.fits_envelope import ONE_SIZE, Envelope, EnvelopeFit, envelope, envelope_of, fit_envelope
from linlm.scaling.fits_isoflop import MIN_ISOFLOP_RUNS, IsoFlopFit, IsoFlopProfile, isoflop
from linlm.scaling.fits_optimal import common_compute, compute_optimal, law_at, optimum_at
from linlm.scaling.fits_seeds import SeedSpread, Size, measure_spread, pooled_spread, sizes_of
from linlm.scaling.fits_parametric import (MIN_CHINCHILLA_POINTS, ParametricFit, ParametricPoints, fit_parametric,
                                           fit_runs_parametric, parametric_points)
from linlm.scaling.fits_power import (MIN_POWER_LAW_POINTS, Crossover, PowerLaw, crossover, crossover_between,
                                      fit_power_law, set_samples)

__all__ = ["MIN_CHINCHILLA_POINTS", "MIN_ISOFLOP_RUNS", "MIN_POWER_LAW_POINTS", "ONE_SIZE", "PFLOPS_DAY", "Crossover",
           "Curve", "Envelope", "EnvelopeFit", "IsoFlopFit", "IsoFlopProfile", "ParametricFit", "ParametricPoints",
           "PowerLaw", "SeedSpread", "Size", "common_compute", "compute_optimal", "crossover", "crossover_between",
           "envelope", "envelope_of", "fit_envelope", "fit_parametric", "fit_power_law", "fit_runs_parametric",
           "isoflop", "law_at", "measure_spread", "optimum_at", "parametric_points", "percentile_ci",
           "pooled_spread", "resample_groups", "resample_points", "set_samples", "sizes_of", "smooth"]
