"""The headline claims of the papers, each judged from this job's own numbers.

One module per paper holds its claims as typed records (:class:`linlm.reproduce.claims.record.Claim`: the
statement, the paper's own terms, the difference judged, the sections read); one rule decides every verdict
(:mod:`linlm.reproduce.claims.rule`: the 95 % interval of each difference over the unit that varies, Holm over all
of them, alike only by two one-sided tests within a stated margin); the claims read the sections through typed
records (:mod:`linlm.reproduce.claims.evidence`). A verdict is computed, never written in advance.
"""

from __future__ import annotations

from linlm.reproduce.claims import delta_rule, hybrid, mossnet, scaling_laws
from linlm.reproduce.claims.record import Claim, Verdict, judge
from linlm.reproduce.claims.rule import AGAINST, ALIKE, CANNOT, FOR, MIXED, OUTCOMES, Difference

CLAIMS: list[Claim] = [*scaling_laws.CLAIMS, *mossnet.CLAIMS, *delta_rule.CLAIMS, *hybrid.CLAIMS]

__all__ = ["AGAINST", "ALIKE", "CANNOT", "CLAIMS", "Claim", "Difference", "FOR", "MIXED", "OUTCOMES", "Verdict",
           "judge"]
