"""The one rule every claim is judged by.

A claim names the differences it is about (:class:`Difference`: a loss, an exponent, an accuracy, the optimal
size, a spread, one architecture against another). Each difference has a point estimate and a 95 % interval from
the unit that varies:

- trained models: their seeds. Seeds that share the data order (the same train seed on the same data) are
  paired, and the interval is the paired t interval of the per-seed differences (n - 1 degrees of freedom);
  seeds that do not pair give Welch's t interval. One seed a side: "cannot tell: one seed".
- fitted laws: their seed replicates (:mod:`linlm.scaling.fits_seeds`), the percentile interval of the
  difference over replicates (the two sides' replicates are independent draws).

**Outcomes.** Each difference is tested against zero (two-sided: a t test, or the replicates on either side of 0).
Holm's correction runs over every difference of every claim of the report that is tested (family-wise error 5 %; a
difference with a reason it cannot be judged, such as one seed or a run that did not plateau, is decided before any
p-value and is not tested, so it is not in the family): the k-th smallest of m p-values counts when it is at most
0.05 / (m - k + 1), and so did every smaller one. A counted difference on the side the claim predicts is **for**, on
the other side **against**. A difference that did not count is **alike** only when two one-sided tests (TOST) put it
inside ± its margin, stated beside it, Holm-corrected over the same family; otherwise **cannot tell**. A claim that
predicts no difference (``predicts="alike"``) is for when its differences are alike and against when they count. A
claim's verdict is its parts' one outcome when they agree, **mixed** (listing them) when they do not; a claim that
cannot be judged at all says **cannot tell** and why (one seed, one size, a fit refused, every model at chance, a
section that did not run).

**False verdicts.** With no true difference, the chance of any false for or against in the whole report is at most
5 % (exact for t intervals when seed noise is normal; for replicates as far as their intervals cover, which
bench_fit_calibration.py measures); with a true difference of at least the margin, the chance of any false
"alike" is at most 5 %. bench_verdicts.py measures both rates on pure-noise claims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

LEVEL = 0.05  # family-wise error of the report: Holm over every difference
FOR, AGAINST, ALIKE, CANNOT, MIXED = "for", "against", "alike", "cannot tell", "mixed"
OUTCOMES = (FOR, AGAINST, ALIKE, CANNOT, MIXED)


@dataclass
class Difference:
    """One difference a claim is about: ``a`` minus ``b`` of ``what``, in ``unit``.

    Its spread is either per-seed values (``a_values``, ``b_values``: {seed: value}) or replicates
    (``a_replicates``, ``b_replicates``), or neither with ``reason`` (why it cannot be judged). ``predicts``: the
    sign the claim predicts ("higher": a above b, "lower", or "alike"); ``margin``: the equivalence margin (None:
    no alike verdict); ``exact``: a measured number with no noise (a state size), compared as it is."""

    name: str
    what: str
    unit: str
    predicts: str
    margin: Optional[float] = None
    a_values: Optional[dict] = None
    b_values: Optional[dict] = None
    a_replicates: Optional[Sequence[float]] = None
    b_replicates: Optional[Sequence[float]] = None
    value: Optional[float] = None  # the point estimate when it is not the mean of the values (a fitted law's)
    reason: Optional[str] = None
    exact: bool = False
    note: str = ""  # what else the reader should know about this part (plateau, active parameters, ...)
    alike_means: Optional[str] = None  # the outcome "alike" gives (default: for a claim of no difference, else alike)
    # Filled by the rule:
    interval: Optional[tuple[float, float]] = None
    p: Optional[float] = None  # two-sided, no difference
    p_alike: Optional[float] = None  # TOST within the margin
    method: str = ""
    n: str = ""
    outcome: str = CANNOT
    holm: str = ""

    def __post_init__(self) -> None:
        if self.reason is None and not self.exact:
            self._estimate()

    # ---- the estimate, its interval and its p-values ------------------------------------------------------

    def _estimate(self) -> None:
        if self.a_replicates is not None and self.b_replicates is not None:
            m = min(len(self.a_replicates), len(self.b_replicates))
            if m < 20:
                self.reason = f"too few replicates ({m}) for an interval"
                return
            reps = np.asarray(self.a_replicates[:m], float) - np.asarray(self.b_replicates[:m], float)
            self._from_replicates(reps)
        elif self.a_values is not None and self.b_values is not None:
            self._from_seeds()
        else:
            self.reason = self.reason or "no spread to judge it by"

    def _from_replicates(self, reps: np.ndarray) -> None:
        b = len(reps)
        lo, hi = np.percentile(reps, [2.5, 97.5])
        self.interval = (float(lo), float(hi))
        if self.value is None:
            self.value = float(np.median(reps))
        below, above = int((reps <= 0).sum()), int((reps >= 0).sum())
        self.p = min(1.0, 2 * (min(below, above) + 1) / (b + 1))
        if self.margin is not None:
            self.p_alike = max((int((reps <= -self.margin).sum()) + 1) / (b + 1),
                               (int((reps >= self.margin).sum()) + 1) / (b + 1))
        self.method = f"{b} seed replicates of each side, percentile interval"
        self.n = f"{b} replicates"

    def _from_seeds(self) -> None:
        from scipy import stats

        a, b = self.a_values, self.b_values
        common = sorted(set(a) & set(b))
        if len(common) >= 2:
            d = np.array([a[s] - b[s] for s in common], float)
            n, mean = len(d), float(d.mean())
            se, df = float(d.std(ddof=1)) / math.sqrt(n), n - 1
            self.method, self.n = f"paired by seed, t with {df} degree(s) of freedom", f"{n} seed pairs"
        elif len(a) >= 2 and len(b) >= 2:
            xa, xb = np.array(list(a.values()), float), np.array(list(b.values()), float)
            va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
            mean, se = float(xa.mean() - xb.mean()), math.sqrt(va + vb)
            df = (va + vb) ** 2 / (va ** 2 / (len(xa) - 1) + vb ** 2 / (len(xb) - 1)) if va + vb > 0 else 1.0
            self.method, self.n = f"Welch's t ({df:.1f} degrees of freedom)", f"{len(xa)} and {len(xb)} seeds"
        else:
            self.reason = f"one seed ({len(a)} against {len(b)}): no spread over seeds"
            return
        self.value = mean
        if se == 0:  # identical seeds: no noise measured; the difference is what it is
            self.interval, self.p = (mean, mean), (0.0 if mean else 1.0)
            self.p_alike = None if self.margin is None else (0.0 if abs(mean) < self.margin else 1.0)
            return
        q = float(stats.t.ppf(0.975, df))
        self.interval = (mean - q * se, mean + q * se)
        self.p = float(2 * stats.t.sf(abs(mean) / se, df))
        if self.margin is not None:
            self.p_alike = float(max(stats.t.sf((mean + self.margin) / se, df),
                                     stats.t.sf((self.margin - mean) / se, df)))

    # ---- shown --------------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {"name": self.name, "what": self.what, "unit": self.unit, "predicts": self.predicts,
                "margin": self.margin, "value": self.value, "interval": list(self.interval) if self.interval else None,
                "p": self.p, "p_alike": self.p_alike, "method": self.method, "n": self.n, "outcome": self.outcome,
                "holm": self.holm, "reason": self.reason, "note": self.note,
                "a_values": _keyed(self.a_values), "b_values": _keyed(self.b_values)}

    def text(self, spec: str = ".4f") -> str:
        if self.reason:
            return f"{self.name}: cannot tell ({self.reason}){self.note}"
        if self.exact:
            return f"{self.name}: {self.value:{spec}}{self.unit}: {self.outcome}{self.note}"
        lo, hi = self.interval
        alike = f", within ±{self.margin:g}" if self.outcome == ALIKE else ""
        unit = f" {self.unit}" if self.unit else ""
        return (f"{self.name}: {self.value:+{spec}}{unit} [{lo:+{spec}}, {hi:+{spec}}] (p {self.p:.3g}, "
                f"{self.n}): {self.outcome}{alike}{self.note}")


def _keyed(values: Optional[dict]) -> Optional[dict]:
    return None if values is None else {str(k): v for k, v in values.items()}


@dataclass
class Assessment:
    """What a claim's judge found: its differences, the numbers the reader needs beside them, the scale it was
    measured at, and why the claim cannot be judged at all (None: its parts decide)."""

    parts: list[Difference] = field(default_factory=list)
    numbers: str = ""
    scale: str = ""
    reason: Optional[str] = None


def holm(p_values: Sequence[float], level: float = LEVEL) -> list[bool]:
    """Which of ``p_values`` count under Holm's step-down correction at family-wise ``level``."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    m, counted = len(p_values), [False] * len(p_values)
    for k, i in enumerate(order):
        if p_values[i] > level / (m - k):
            break
        counted[i] = True
    return counted


def decide(assessments: Sequence[Assessment]) -> None:
    """Set every part's outcome: Holm over every difference of every claim, then TOST for those that did not
    count (see the module doc)."""
    for a in assessments:
        for d in a.parts:
            if not d.exact:
                d.outcome, d.holm = CANNOT, ""
    parts = [d for a in assessments if a.reason is None for d in a.parts if not d.reason and not d.exact]
    m = len(parts)
    counted = holm([d.p for d in parts])
    for d, c in zip(parts, counted):
        d.holm = f"Holm over {m} differences: {'counts' if c else 'does not count'} at 5 %"
        if c:
            up = d.value > 0
            d.outcome = (AGAINST if d.predicts == ALIKE else
                         FOR if (d.predicts == "higher") == up else AGAINST)
    rest = [d for d, c in zip(parts, counted) if not c and d.p_alike is not None]
    for d, c in zip(rest, holm([d.p_alike for d in rest])):
        d.holm += f"; alike over {len(rest)}: {'yes' if c else 'no'}"
        d.outcome = (d.alike_means or (FOR if d.predicts == ALIKE else ALIKE)) if c else CANNOT


def verdict_of(assessment: Assessment) -> tuple[str, Optional[str]]:
    """(the claim's verdict, why it cannot tell or which parts are mixed)."""
    if assessment.reason is not None:
        return CANNOT, assessment.reason
    if not assessment.parts:
        return CANNOT, "nothing to compare"
    outcomes = [d.outcome for d in assessment.parts]
    if len(set(outcomes)) == 1:
        if outcomes[0] == CANNOT:
            why = "; ".join(f"{d.name}: {d.reason or 'the difference is inside its noise'}" for d in assessment.parts)
            return CANNOT, why
        return outcomes[0], None
    return MIXED, ", ".join(f"{d.name} {d.outcome}" for d in assessment.parts)


def threshold_rows(margins: dict[str, str]) -> list[list[str]]:
    """The report's table of tests: each test, when it gives a verdict, and its chance of a false one."""
    rows = [
        ["paired t over seeds", "trained models whose seeds share the data order",
         "for / against when it counts under Holm", "at most 5 % for the whole report with no true difference "
         "(exact when seed noise is normal; 3 seeds: 2 degrees of freedom)"],
        ["Welch's t over seeds", "trained models whose seeds do not pair", "as above", "as above (approximate)"],
        ["seed replicates of fitted laws", "exponents, losses and optima read off scaling fits",
         "for / against when 0 lies outside the replicates' interval under Holm",
         "about 5 % (the intervals held the truth for >= 90 % of noise seeds in bench_fit_calibration.py)"],
        ["two one-sided tests (TOST)", "any difference that did not count, within its margin",
         "alike (for, when the claim is that there is no difference)",
         "at most 5 % for the whole report when the true difference is at least the margin"],
        ["Holm step-down", "every difference of every claim together",
         "the k-th smallest of m p-values counts at p <= 0.05 / (m - k + 1)", "keeps the two rates above"]]
    rows += [[f"margin: {k}", v, "the band inside which a difference is 'alike'", "stated, not estimated"]
             for k, v in margins.items()]
    return rows
