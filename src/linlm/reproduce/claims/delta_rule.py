"""The retrieval claim of the delta rule (DeltaNet, arXiv 2406.06484; Gated DeltaNet, arXiv 2412.06464).

The delta rule's point is recall: its state learns key -> value pairs (each write first removes what the state held
along the key) where gated linear attention and SSMs add pairs up and decay them. So the claim is judged at equal
state: MQAR accuracy of each delta-rule model minus each gated linear state of the same floats per layer that the
job trained (HGRN2, Mamba-2 where registered), paired by seed. LLaMA's KV cache is no equal state; its accuracy is
shown beside them as the ceiling. A pair whose recorded states per layer differ by more than ``STATE_TOL`` is not
judged ("cannot tell", with both sizes): the recipe's ``mqar.per_arch`` sets the options that equalise them.
"""

from __future__ import annotations

from typing import Optional

from linlm.reproduce.claims.evidence import Retrieval
from linlm.reproduce.claims.record import Claim
from linlm.reproduce.claims.rule import Assessment
from linlm.reproduce.claims.scaling_laws import (ACC_MARGIN, accuracies_line, accuracy_part, baseline,
                                                 mqar_undecidable, retrieval_result)

PAPER = "DeltaNet (arXiv 2406.06484), Gated DeltaNet (arXiv 2412.06464)"
DELTA = ("deltanet", "gated_deltanet")
# The gated linear states the delta rule is compared with, when the job trained them (Mamba-2 once registered).
PEERS = ("hgrn2", "mamba2")
STATE_TOL = 0.02  # states per layer within 2 % are equal (as linlm.experiments.mqar_summary counts them)


def state_reason(r: Retrieval, a: str, b: str) -> Optional[str]:
    """Why ``a`` and ``b`` are not at equal state per layer (as the runs recorded it), or None when they are."""
    sa, sb = r.state(a), r.state(b)
    if sa is None or sb is None:
        return f"state per layer not recorded for {a if sa is None else b}"
    if abs(sa / sb - 1.0) > STATE_TOL:
        return f"not at equal state: {sa:,.0f} against {sb:,.0f} floats per layer"
    return None


def recalls_better(results: dict) -> Assessment:
    r, why = retrieval_result(results.get("mqar"), "mqar")
    if why:
        return Assessment(reason=why)
    deltas = [a for a in DELTA if r.values(a)]
    peers = [a for a in PEERS if r.values(a)]
    if not deltas or not peers:
        return Assessment(reason=f"mqar trained no {'delta-rule model' if not deltas else 'gated linear peer'} "
                                 f"({', '.join(DELTA if not deltas else PEERS)})")
    parts = []
    for a in deltas:
        for b in peers:
            part = accuracy_part(r, a, b, "higher")
            part.reason = part.reason or state_reason(r, a, b)
            parts.append(part)
    states = ", ".join(f"{c} {r.state(c):,.0f}" for c in (*deltas, *peers) if r.state(c) is not None)
    numbers = accuracies_line(r, [baseline(), *deltas, *peers])
    numbers += f"; state per layer (floats): {states}" if states else ""
    return Assessment(parts, numbers, f"MQAR at d={r.width()}, equal state per layer")


def recall_undecidable(job) -> Optional[str]:
    m = job.recipe.mqar
    if not m.widths:
        return mqar_undecidable(job, ())  # the experiment is not run
    names = {c.name().rsplit("-d", 1)[0] for c in m.configs()}
    if not set(DELTA) & names or not set(PEERS) & names:
        return f"mqar trains no {'delta-rule model' if not set(DELTA) & names else 'hgrn2 or mamba2'}"
    return mqar_undecidable(job, ())


CLAIMS = [
    Claim("delta-recall", "The delta rule recalls better than a gated linear state of the same size", PAPER,
          "MQAR in Zoology's setting: DeltaNet above Mamba and GLA at equal model width (DeltaNet); Gated DeltaNet "
          "above Mamba-2 and DeltaNet on needle-in-a-haystack retrieval (Gated DeltaNet)",
          f"MQAR accuracy of DeltaNet and Gated DeltaNet minus HGRN2's (and Mamba-2's) at equal state per layer, "
          f"paired by seed, each at its own learning rate and trained to a plateau; LLaMA shown as the ceiling; "
          f"alike within ±{ACC_MARGIN}", ("mqar",), recalls_better, recall_undecidable),
]
