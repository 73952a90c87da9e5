"""A claim as a typed record, and its verdict.

A :class:`Claim` is written once, in its paper's module: the statement, the paper and what the paper itself
measured (its own terms), the difference this job judges it by, the sections it reads, and ``assess``, which
reads those sections (:mod:`linlm.reproduce.claims.evidence`) and returns the differences
(:class:`linlm.reproduce.claims.rule.Assessment`). :func:`judge` assesses every claim, decides every difference
under the one rule (:func:`linlm.reproduce.claims.rule.decide`, Holm over all of them) and returns the verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from linlm.reproduce.claims.rule import Assessment, decide, verdict_of


@dataclass(frozen=True)
class Claim:
    key: str  # a short name, stable across versions (results.json, the README)
    statement: str
    paper: str
    terms: str  # what the paper measured, in its own terms
    difference: str  # what this job judges it by
    reads: tuple[str, ...]  # the sections whose results it reads
    assess: Callable[[dict], Assessment]  # (the job's results by section) -> its differences
    # (the job, before it runs) -> why its recipe's settings cannot decide this claim, or None (--dry-run says it)
    undecidable: Callable[[object], Optional[str]] = lambda job: None


@dataclass
class Verdict:
    """A claim judged: its verdict (for, against, alike, mixed, cannot tell), why (cannot tell, mixed), each
    difference with its interval and outcome, the numbers beside them and the scale they were measured at."""

    key: str
    claim: str
    paper: str
    terms: str
    difference: str
    verdict: str
    why: Optional[str]
    parts: list = field(default_factory=list)
    numbers: str = ""
    scale: str = ""

    @property
    def evidence(self) -> str:
        """The parts and the numbers, as the claims table shows them."""
        shown = "; ".join(p.text() for p in self.parts)
        return "; ".join(x for x in (shown, self.numbers) if x)

    @property
    def rule(self) -> str:
        return self.difference

    def to_dict(self) -> dict:
        return {"key": self.key, "claim": self.claim, "paper": self.paper, "terms": self.terms,
                "difference": self.difference, "verdict": self.verdict, "why": self.why, "scale": self.scale,
                "numbers": self.numbers, "evidence": self.evidence, "parts": [p.to_dict() for p in self.parts]}


def judge(results: dict, claims: Optional[list[Claim]] = None) -> list[Verdict]:
    """Every claim (default: :data:`linlm.reproduce.claims.CLAIMS`) from the job's saved sections; a section
    that did not run makes its claims "cannot tell", saying so."""
    from linlm.reproduce.claims import CLAIMS

    claims = CLAIMS if claims is None else claims
    assessments = [c.assess(results) for c in claims]
    decide(assessments)
    out = []
    for c, a in zip(claims, assessments):
        verdict, why = verdict_of(a)
        out.append(Verdict(c.key, c.statement, c.paper, c.terms, c.difference, verdict, why, list(a.parts),
                           a.numbers, a.scale))
    return out
