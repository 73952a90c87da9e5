"""The hybrid claim: a few attention layers give a linear model back the recall its fixed-size state loses.

Waleffe et al. (arXiv 2406.07887) trained 8B Mamba, Mamba-2, a Transformer and Mamba-2-Hybrid (43 % Mamba-2, 7 %
self-attention, 50 % MLP layers) on the same data: the pure SSMs lag the Transformer on copying and in-context
recall (five-shot MMLU, Phonebook Lookup), and the hybrid exceeds the Transformer on all 12 standard tasks.

Judged on the ``hybrid`` section's MQAR runs, paired by seed, for each linear architecture of the study:

- the hybrid minus its linear model: for when the hybrid recalls more;
- the hybrid minus LLaMA: for when it recalls as much (alike within the margin) or more, against when it recalls
  less (a non-inferiority reading: the claim is that the attention layers recover the recall, not that they beat
  a model of attention layers only).
"""

from __future__ import annotations

from typing import Optional

from linlm.reproduce.claims.record import Claim
from linlm.reproduce.claims.rule import FOR, Assessment
from linlm.reproduce.claims.scaling_laws import (ACC_MARGIN, accuracies_line, accuracy_part, baseline,
                                                 retrieval_result, training_undecidable)

PAPER = "Mamba-2-Hybrid (arXiv 2406.07887)"
SECTION = "hybrid"


def hybrid_configs(r) -> list[tuple[str, str]]:
    """[(the linear model's configuration, its hybrid's)] among the section's runs."""
    linear = {x.arch: x.config for x in r.runs if x.study.get("hybrid") == "linear"}
    hybrid = {x.arch: x.config for x in r.runs if x.study.get("hybrid") == "hybrid"}
    return [(linear[a], hybrid[a]) for a in linear if a in hybrid]


def recovers_recall(results: dict) -> Assessment:
    r, why = retrieval_result(results.get(SECTION), SECTION)
    if why:
        return Assessment(reason=why)
    pairs = hybrid_configs(r)
    if not pairs:
        return Assessment(reason="the hybrid section trained no linear model beside its hybrid")
    base, parts = baseline(), []
    for linear, hybrid in pairs:
        parts.append(accuracy_part(r, hybrid, linear, "higher"))
        beside = accuracy_part(r, hybrid, base, "higher")
        beside.alike_means = FOR
        parts.append(beside)
    shown = [base, *(c for p in pairs for c in p)]
    return Assessment(parts, accuracies_line(r, shown), f"MQAR at d={r.width()}, equal tokens")


def hybrid_undecidable(job) -> Optional[str]:
    s = job.recipe.hybrid
    return "the recipe runs no hybrid study" if not s.archs else training_undecidable(s, SECTION)


CLAIMS = [
    Claim("hybrid", "A few attention layers give a linear model back its recall", PAPER,
          "8B models on the same 3.5T tokens: Mamba and Mamba-2 below the Transformer on copying and in-context "
          "recall (five-shot MMLU, Phonebook); Mamba-2-Hybrid (7 % attention layers) above it on all 12 standard "
          "tasks",
          f"MQAR accuracy of each linear model with one attention layer in k minus the same model without them "
          f"(higher), and minus LLaMA's (as high: alike within ±{ACC_MARGIN}, or higher), paired by seed, at equal "
          f"width, depth and tokens, each trained to a plateau", (SECTION,), recovers_recall, hybrid_undecidable),
]
