"""Seeds: the comparison trained once per seed, the spread of a number over seeds, and the rule that says whether
two architectures differ by more than that spread.

A recipe's ``compare.seeds`` (default 1) trains every architecture of the comparison that many times, with the
train config's ``seed`` set to the ladder's seed + 0, 1, ...; with more than one seed each rung ``R`` becomes the
rungs ``R-s0``, ``R-s1``, ... (run directories ``ARCH-R-s0`` and so on), so one seed keeps the names it always had.

The rule (:func:`compare`): a difference between two architectures counts only when their ranges over seeds do not
overlap and their means differ by more than the claim's margin. Justification in one line: if the seed were the
only difference, every ordering of the ``n_a + n_b`` values would be equally likely, so all of one side below all
of the other happens with probability ``1 / C(n_a + n_b, n_a)`` (:func:`chance_of_separation`: 0.05 for 3 seeds
each) -- an exact permutation test that assumes nothing about the distribution. With fewer seeds than make that
probability at most :data:`SIGNIFICANCE` a separation cannot count, and the outcome says so ("one seed: no spread"
for a single seed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from linlm.errors import ConfigError

SIGNIFICANCE = 0.05  # the largest chance of a separation by seed noise alone that still counts as a difference
ONE_SEED = "one seed: no spread"
MAX_SEEDS = 100  # trainings of one model: more is a typo (and would plan millions of runs)


def seed_count(compare: dict, where: str) -> int:
    """The comparison's seeds (``compare.seeds``, default 1); anything but a whole number >= 1 is refused, the
    message starting with ``where`` (the recipe's key, or the flag)."""
    seeds = compare.get("seeds", 1)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
        raise ConfigError(f"{where}: give a whole number of training seeds from 1 to {MAX_SEEDS}, got {seeds!r} "
                          "(nothing was changed)")
    return seeds


def seed_values(compare: dict, seeds: int) -> list[int]:
    """The train config seeds of the comparison's runs: the ladder's own seed (0 unless its train sets one) + 0,
    1, ..., seeds - 1."""
    base = int((compare.get("train") or {}).get("seed") or 0)
    return [base + i for i in range(seeds)]


def seeded_ladder(compare: dict, seeds: int) -> dict:
    """The comparison's ladder mapping with ``seeds`` runs per architecture and rung (see the module doc)."""
    from linlm.schema import deep_merge

    data = {k: v for k, v in compare.items() if k != "seeds"}
    if seeds == 1:
        return data
    rungs = [{**r, "name": f"{r['name']}-s{i}", "train": deep_merge(r.get("train") or {}, {"seed": seed})}
             for r in data.get("rungs") or [] for i, seed in enumerate(seed_values(data, seeds))]
    return {**data, "rungs": rungs}


@dataclass
class Spread:
    """A number over seeds: its mean, sample standard deviation (n - 1; None for one seed), min and max."""

    values: list[float]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / self.n

    @property
    def std(self):
        if self.n < 2:
            return None
        m = self.mean
        return math.sqrt(sum((v - m) ** 2 for v in self.values) / (self.n - 1))

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)

    def to_dict(self) -> dict:
        return {"n": self.n, "mean": self.mean, "std": self.std, "min": self.lo, "max": self.hi,
                "values": list(self.values)}

    def text(self, spec: str = ".4f") -> str:
        """``mean ± std [min, max] (n seeds)``, or the one value and "one seed"."""
        if self.n < 2:
            return f"{self.mean:{spec}} (one seed)"
        return f"{self.mean:{spec}} ± {self.std:{spec}} [{self.lo:{spec}}, {self.hi:{spec}}] ({self.n} seeds)"


def chance_of_separation(n_a: int, n_b: int) -> float:
    """The probability that all of n_a values fall below all of n_b when every ordering is equally likely."""
    return 1.0 / math.comb(n_a + n_b, n_a)


def compare(a: Sequence[float], b: Sequence[float], margin: float) -> str:
    """``"lower"`` (a below b), ``"higher"``, ``"tie"`` (ranges overlap, or the means within ``margin``),
    ``ONE_SEED`` or ``"too few seeds"`` (no separation could count: see the module doc)."""
    sa, sb = Spread(list(a)), Spread(list(b))
    if min(sa.n, sb.n) < 2:
        return ONE_SEED
    if chance_of_separation(sa.n, sb.n) > SIGNIFICANCE:
        return "too few seeds"
    if abs(sa.mean - sb.mean) <= margin:
        return "tie"
    if sa.hi < sb.lo:
        return "lower"
    if sb.hi < sa.lo:
        return "higher"
    return "tie"


def rule_text(margin: float, unit: str) -> str:
    """The rule of :func:`compare`, as the report states it."""
    return (f"a difference counts only when the ranges over seeds do not overlap and the means differ by more than "
            f"{margin:g} {unit} (a separation that seed noise alone gives with probability 1/C(n_a+n_b, n_a) = "
            f"{chance_of_separation(3, 3):.2f} for 3 seeds each; counted only when that is <= {SIGNIFICANCE}); "
            "otherwise a tie")
