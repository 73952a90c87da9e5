"""Seeds: the comparison trained once per seed, and the spread of a number over seeds (the report's tables). The
rule that judges a difference over seeds is :mod:`linlm.reproduce.claims.rule`.

A recipe's ``compare.seeds`` (default 1) trains every architecture of the comparison that many times, with the
train config's ``seed`` set to the ladder's seed + 0, 1, ...; with more than one seed each rung ``R`` becomes the
rungs ``R-s0``, ``R-s1``, ... (run directories ``ARCH-R-s0`` and so on), so one seed keeps the names it always had.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from linlm.errors import ConfigError

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
