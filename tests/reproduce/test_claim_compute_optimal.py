"""The claim "at the compute optimum, linear models use more parameters and tokens" follows the intervals of the
fits' compute_optimal block: apart and above is a win, overlapping is a tie."""

from __future__ import annotations

from linlm.reproduce import claims as C


def _fits(rows: dict, c: float = 1e-6) -> dict:
    """rows: arch -> (N_opt, N_opt interval, D_opt, D_opt interval)."""
    archs = {a: {"envelope": {"N_opt(C)": {"alpha": 0.6, "alpha_ci": [0.5, 0.7]},
                              "D_opt(C)": {"alpha": 0.4, "alpha_ci": [0.3, 0.5]}},
                 "paper": {"N_opt(C)": {"beta": 2e8, "alpha": 0.65}}} for a in rows}
    return {"archs": archs, "compute_optimal": {"compute_pflops_days": c, "archs": {
        a: {"N_opt": n, "N_opt_ci": list(nci), "D_opt": d, "D_opt_ci": list(dci), "paper_N_opt": 2e8 * c ** 0.65,
            "paper_D_opt": None} for a, (n, nci, d, dci) in rows.items()}}}


LLAMA = (1e6, (0.9e6, 1.1e6), 1e8, (0.9e8, 1.1e8))
ABOVE = (2e6, (1.5e6, 2.5e6), 2e8, (1.5e8, 2.5e8))
OVERLAP = (1.05e6, (1.0e6, 1.2e6), 2e8, (1.5e8, 2.5e8))
BELOW = (0.5e6, (0.4e6, 0.6e6), 0.5e8, (0.4e8, 0.6e8))


def test_the_verdict_follows_the_intervals():
    claim = C.more_params_and_tokens_at_optimum(_fits({"llama": LLAMA, "tnl": ABOVE, "hgrn2": ABOVE,
                                                       "cosformer2": ABOVE}))
    assert claim.verdict == "supported"
    assert "2.00x llama" in claim.evidence and "paper 1.00x" in claim.evidence and "(paper 0.6500)" in claim.evidence
    partly = _fits({"llama": LLAMA, "tnl": ABOVE, "hgrn2": OVERLAP, "cosformer2": ABOVE})
    assert C.more_params_and_tokens_at_optimum(partly).verdict == "partly supported"
    ties = _fits({"llama": LLAMA, "tnl": OVERLAP, "hgrn2": OVERLAP, "cosformer2": OVERLAP})
    assert C.more_params_and_tokens_at_optimum(ties).verdict == "tie"
    below = _fits({"llama": LLAMA, "tnl": BELOW, "hgrn2": OVERLAP, "cosformer2": OVERLAP})
    assert C.more_params_and_tokens_at_optimum(below).verdict == "not supported"
    assert C.more_params_and_tokens_at_optimum(_fits({"tnl": ABOVE})).verdict == "not supported at this scale"
    assert C.more_params_and_tokens_at_optimum(None).verdict == "not measured"
    assert claim.claim in [c.claim for c in C.judge({})]
