"""Seeds in the scaling fits: the runs of one size, how much a loss curve moves from seed to seed, and the
replicates the fits' intervals are drawn from.

**Sizes.** Runs of one architecture with the same N are seeds of one size (a ladder trains a second seed of some
sizes as rungs of their own, ``RUNG-s1``). A size's curve is the mean of its seeds' log losses at the tokens they
all logged. Two runs of one size with the same train seed are one run given twice (a copied directory): refused,
naming both, since counting it twice would fake a seed spread of zero.

**The spread.** A seed's smoothed log loss, against its size's mean, is modelled as an offset constant along the
curve (standard deviation ``offset``: another initialisation and data order shift the whole curve) plus a wiggle
along it, an AR(1) process of standard deviation ``wiggle`` and lag-1 coefficient ``phi``. Both are measured from
the sizes that have two seeds or more (pooled, with their degrees of freedom: ``dof`` for the offset); an
architecture with none takes the spread pooled over the architectures that have them.

**Replicates.** Replicate k adds to each size's mean curve its own draw of that noise, scaled by 1/sqrt(seeds of
the size), and the fits are made again on it: the unit that varies is the seed, not a point of the envelope's grid
(whose number is arbitrary). The offset's standard deviation of each replicate is itself drawn from its measured
value's uncertainty (scaled inverse chi-square with ``dof`` degrees of freedom), so that a spread measured on a
few seeds gives wider intervals, as a t interval would. On cpu-like synthetic ladders (bench_fit_calibration.py)
the 95 % percentile intervals of the replicates held the true L(C) exponent, the loss at a common compute and the
optimal size there for at least 90 % of 100 noise seeds; resampling the envelope's points held the exponent for
about 40 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from linlm.errors import DataError
from linlm.scaling.fits_common import Curve


@dataclass
class Size:
    """The runs of one size of one architecture, on the tokens they all logged (smoothed curves)."""

    curve: Curve  # the first run's (its N and FLOPs per token)
    runs: list[str]
    tokens: np.ndarray
    log_loss: np.ndarray  # seeds x points

    @property
    def seeds(self) -> int:
        return len(self.runs)

    @property
    def compute(self) -> np.ndarray:
        return self.tokens * self.curve.paper_flops_per_token

    @property
    def loss(self) -> np.ndarray:
        return np.exp(self.log_loss.mean(axis=0))

    def row(self, noise: Optional[np.ndarray] = None) -> tuple:
        """(curve, compute, loss, tokens) as :func:`linlm.scaling.fits_common.usable` gives them, the mean curve
        times exp(noise) when noise is given."""
        loss = self.loss if noise is None else self.loss * np.exp(noise)
        return (self.curve, self.compute, loss, self.tokens)


def sizes_of(rows: Sequence[tuple]) -> list[Size]:
    """The sizes of ``rows`` (:func:`linlm.scaling.fits_common.usable`'s), in order of N."""
    by: dict[float, list[tuple]] = {}
    for row in rows:
        by.setdefault(row[0].params, []).append(row)
    out = []
    for params in sorted(by):
        group = by[params]
        seeds = [r[0].seed for r in group if r[0].seed is not None]
        twice = sorted({s for s in seeds if seeds.count(s) > 1})
        if twice:
            names = [r[0].name for r in group if r[0].seed == twice[0]]
            raise DataError(f"runs {' and '.join(names)}: one size ({params:,.0f} parameters) trained twice with "
                            f"seed {twice[0]}: one run given twice (a copied directory?); counting it twice would "
                            "fake a seed spread of zero. Move one of them out of the sweep")
        tokens = group[0][3]
        for r in group[1:]:
            tokens = np.intersect1d(tokens, r[3])
        if len(tokens) < 2:  # seeds logged at other tokens: each one on the first one's tokens, inside its range
            tokens = group[0][3][(group[0][3] >= max(r[3].min() for r in group))
                                 & (group[0][3] <= min(r[3].max() for r in group))]
        logs = np.stack([np.interp(np.log(tokens), np.log(r[3]), np.log(r[2])) for r in group])
        out.append(Size(group[0][0], [r[0].name for r in group], tokens, logs))
    return out


@dataclass
class SeedSpread:
    """How a seed's smoothed log loss moves about its size's mean (see the module doc)."""

    offset: float
    wiggle: float
    phi: float
    dof: int  # degrees of freedom of ``offset``: sum over the sizes with seeds of (seeds - 1)
    sizes: int  # sizes it was measured on
    source: str  # where it comes from: "its own seeds", or the architectures it was pooled from

    def to_dict(self) -> dict:
        return {"offset": self.offset, "wiggle": self.wiggle, "phi": self.phi, "dof": self.dof, "sizes": self.sizes,
                "source": self.source}

    def noise(self, rng: np.random.Generator, points: int, seeds: int) -> np.ndarray:
        """One draw of the noise of a mean of ``seeds`` seeds over ``points`` logged points (log loss)."""
        offset = self.offset * math.sqrt(self.dof / rng.chisquare(self.dof)) if self.dof > 0 else self.offset
        e = np.empty(points)
        e[0] = rng.normal(0.0, self.wiggle)
        innovation = rng.normal(0.0, self.wiggle * math.sqrt(1.0 - self.phi ** 2), points)
        for k in range(1, points):
            e[k] = self.phi * e[k - 1] + innovation[k]
        return (rng.normal(0.0, offset) + e) / math.sqrt(seeds)


def measure_spread(sizes: Sequence[Size], source: str = "its own seeds") -> Optional[SeedSpread]:
    """The spread measured on the sizes with two seeds or more, or None when there are none."""
    off_ss = wig_ss = 0.0
    off_dof = wig_dof = 0
    lags: list[float] = []
    seeded = [s for s in sizes if s.seeds >= 2 and s.log_loss.shape[1] >= 3]
    for s in seeded:
        dev = s.log_loss - s.log_loss.mean(axis=0)
        offsets = dev.mean(axis=1)
        off_ss += float((offsets ** 2).sum())
        off_dof += s.seeds - 1
        wiggle = dev - offsets[:, None]
        wig_ss += float((wiggle ** 2).sum())
        wig_dof += (s.seeds - 1) * (dev.shape[1] - 1)
        for w in wiggle:
            denom = float((w ** 2).sum())
            if denom > 0:
                lags.append(float((w[1:] * w[:-1]).sum()) / denom)
    if not off_dof:
        return None
    phi = float(np.clip(np.mean(lags), 0.0, 0.999)) if lags else 0.0
    return SeedSpread(math.sqrt(off_ss / off_dof), math.sqrt(wig_ss / max(wig_dof, 1)), phi, off_dof, len(seeded),
                      source)


def pooled_spread(spreads: dict[str, SeedSpread]) -> Optional[SeedSpread]:
    """The spreads of several architectures pooled, each variance weighted by its degrees of freedom."""
    if not spreads:
        return None
    dof = sum(s.dof for s in spreads.values())
    offset = math.sqrt(sum(s.offset ** 2 * s.dof for s in spreads.values()) / dof)
    wiggle = math.sqrt(sum(s.wiggle ** 2 * s.dof for s in spreads.values()) / dof)
    phi = sum(s.phi * s.dof for s in spreads.values()) / dof
    return SeedSpread(offset, wiggle, phi, dof, sum(s.sizes for s in spreads.values()),
                      "pooled from the seeds of " + ", ".join(sorted(spreads)))


def replicate_rows(sizes: Sequence[Size], spread: SeedSpread, rng: np.random.Generator) -> list[tuple]:
    """One replicate: each size's mean curve with its own draw of the seed noise."""
    return [s.row(spread.noise(rng, len(s.tokens), s.seeds)) for s in sizes]
