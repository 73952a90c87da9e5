"""Each claim in the paper's own terms, judged by the one rule: its verdict follows the differences it names (for,
against, alike, mixed), and it says "cannot tell" with the reason where the data cannot decide (one seed, a fit
refused, every model at chance, a run that had not plateaued, a section that did not run). The architectures come
from the registry."""

from __future__ import annotations

import dataclasses

import pytest
from claim_fixtures import decode, fits, mqar, quality

from linlm.reproduce.claims import CLAIMS, judge
from linlm.reproduce.claims.scaling_laws import ALPHA_MARGIN


def verdict(key: str, results: dict):
    """The verdict of the claim ``key`` judged alone (Holm over its own differences); ``results`` by section, or
    the one section the claim reads."""
    (claim,) = [c for c in CLAIMS if c.key == key]
    if results and not set(results) & {*claim.reads, "compare_quality", "decode", "mossnet_fits", "aspect",
                                       "context"}:
        results = {claim.reads[0]: results}
    return judge(results, [claim])[0]


LINEAR = ("tnl", "hgrn2", "cosformer2")


def test_every_claim_says_cannot_tell_with_the_reason_when_its_section_did_not_run():
    verdicts = judge({})
    assert [v.key for v in verdicts] == [c.key for c in CLAIMS] and len(verdicts) == 13
    for v in verdicts:
        assert v.verdict == "cannot tell" and v.why, v.key
        assert v.terms and v.difference and v.paper


def test_linear_models_scale_like_transformers_by_the_exponents_replicates():
    alike = fits({"llama": -0.080, "tnl": -0.081, "hgrn2": -0.079, "cosformer2": -0.080})
    v = verdict("scale-alike", alike)
    assert v.verdict == "for" and [p.outcome for p in v.parts] == ["for"] * 3
    assert "tnl - llama: -0.0010" in v.evidence and "0.02-0.4M parameters" in v.scale and "1e-07" in v.scale
    apart = fits({"llama": -0.080, "tnl": -0.20, "hgrn2": -0.079, "cosformer2": -0.080})
    v = verdict("scale-alike", apart)
    assert v.verdict == "mixed" and v.why == "tnl - llama against, hgrn2 - llama for, cosformer2 - llama for"
    # The same exponents, too uncertain to be alike within the margin: cannot tell.
    wide = fits({"llama": -0.080, "tnl": -0.081, "hgrn2": -0.079, "cosformer2": -0.080}, sd=ALPHA_MARGIN)
    assert verdict("scale-alike", wide).verdict == "cannot tell"
    # A fit refused (one size) is a part that cannot tell, with the reason; LLaMA's refused: the claim cannot tell.
    refused = fits({"llama": -0.08, "hgrn2": -0.08, "cosformer2": -0.08}, errors={"tnl": "cannot tell: one size"})
    v = verdict("scale-alike", refused)
    assert v.verdict == "mixed" and "tnl - llama: cannot tell (cannot tell: one size)" in v.evidence
    v = verdict("scale-alike", fits({"tnl": -0.08}, errors={"llama": "cannot tell: one size"}))
    assert v.verdict == "cannot tell" and "llama's L(C) fit: cannot tell: one size" in v.why


def test_lower_loss_is_judged_at_a_compute_inside_every_fit():
    lower = fits({a: -0.08 for a in ("llama", *LINEAR)},
                 losses={"llama": (2.30, 0.01), "tnl": (2.20, 0.01), "hgrn2": (2.21, 0.01), "cosformer2": (2.22, 0.01)})
    v = verdict("lower-loss", lower)
    assert v.verdict == "for" and "C* = 1.000e-07" in v.numbers
    higher = fits({a: -0.08 for a in ("llama", *LINEAR)},
                  losses={"llama": (2.0, 0.002), "tnl": (2.2, 0.01), "hgrn2": (2.21, 0.01),
                          "cosformer2": (2.001, 0.002)})
    v = verdict("lower-loss", higher)
    assert v.verdict == "mixed" and v.why.endswith("cosformer2 - llama alike")
    none = fits({"llama": -0.08, "tnl": -0.08}, c_star=None)
    v = verdict("lower-loss", none)
    assert v.verdict == "cannot tell" and "no compute lies inside every fitted range" in v.why


def test_the_optimum_is_compared_at_c_star_and_table_3_quoted_inside_its_own_range():
    more = fits({a: -0.08 for a in ("llama", "tnl")}, optimum={"llama": (1e5, 3e6, 0.05), "tnl": (3e5, 9e6, 0.05)})
    v = verdict("optimum", more)
    assert v.verdict == "for" and [p.name for p in v.parts] == ["tnl / llama N_opt", "tnl / llama D_opt"]
    assert "inside its own compute range (0.43-135 PFLOP/s-days" in v.numbers and "tnl N_opt 1.59x-1.10x" in v.numbers
    fewer = fits({a: -0.08 for a in ("llama", "tnl")}, optimum={"llama": (3e5, 9e6, 0.05), "tnl": (1e5, 3e6, 0.05)})
    assert verdict("optimum", fewer).verdict == "against"
    edge = fits({a: -0.08 for a in ("llama", "tnl")}, losses={"llama": (2.0, 0.01), "tnl": (2.0, 0.01)})
    v = verdict("optimum", edge)
    assert v.verdict == "cannot tell" and "optimum lies outside the sampled sizes" in v.why


def test_retrieval_claims_follow_mqar_accuracy_paired_by_seed():
    strong = mqar({"llama": [0.90, 0.92, 0.91], "tnl": [0.20, 0.22, 0.21], "hgrn2": [0.60, 0.62, 0.61],
                   "cosformer2": [0.10, 0.12, 0.11]})
    assert verdict("weaker-retrieval", strong).verdict == "for"
    assert verdict("decay", strong).verdict == "for"
    reverse = mqar({"llama": [0.30, 0.32, 0.31], "tnl": [0.60, 0.62, 0.61], "hgrn2": [0.45, 0.46, 0.47],
                    "cosformer2": [0.70, 0.72, 0.71]})
    assert verdict("weaker-retrieval", reverse).verdict == "against" and verdict("decay", reverse).verdict == "against"
    # Seeds that move together (one data order each) pair: a steady difference counts although the seeds scatter.
    paired = mqar({"llama": [0.5, 0.8, 0.3], "tnl": [0.4, 0.7, 0.2], "hgrn2": [0.7, 0.9, 0.4],
                   "cosformer2": [0.45, 0.75, 0.25]})
    v = verdict("weaker-retrieval", paired)
    assert v.parts[0].method.startswith("paired by seed") and v.parts[0].outcome == "for"
    one = mqar({"llama": [0.9], "tnl": [0.1], "hgrn2": [0.6], "cosformer2": [0.1]})
    v = verdict("weaker-retrieval", one)
    assert v.verdict == "cannot tell" and "one seed" in v.why
    chance = mqar({"llama": [0.02, 0.01, 0.015], "tnl": [0.01] * 3, "hgrn2": [0.012] * 3, "cosformer2": [0.01] * 3})
    v = verdict("decay", chance)
    assert v.verdict == "cannot tell" and "both at chance" in v.why
    # A deciding run that stopped before its loss plateaued: its accuracy measures learning speed, so no verdict.
    stopped = mqar({"hgrn2": [0.6, 0.62, 0.61], "tnl": [0.2, 0.22, 0.21]}, plateaued={"tnl": [True, False, True]})
    v = verdict("decay", stopped)
    assert v.verdict == "cannot tell" and "not plateaued: tnl seed 1" in v.why
    # A run whose loss never fell below copying a value of its context: it has not started to retrieve.
    stopped["runs"][0]["copying"] = True  # hgrn2 seed 0, recorded as plateaued
    v = verdict("decay", stopped)
    assert v.verdict == "cannot tell" and "hgrn2 seed 0 (copying a context value)" in v.why


def test_shape_claims_are_judged_on_the_spread_of_retrieval_across_shapes():
    def study(spreads: dict, key: str = "shape") -> dict:
        acc, tags = {}, {}
        for arch, (top, spread, noise) in spreads.items():
            for i, level in enumerate(("a", "b", "c")):
                name = f"{arch}@{level}"
                acc[name] = [top - spread * (i == 2) + noise * s for s in range(3)]
                tags[name] = {key: level}
        return mqar(acc, study=tags)

    more = {"aspect": study({"llama": (0.9, 0.05, 0.01), "cosformer2": (0.8, 0.5, 0.01)})}
    v = verdict("aspect", more)
    assert v.verdict == "for" and "spread of MQAR accuracy across shapes" in v.parts[0].what
    less = {"context": study({"llama": (0.9, 0.5, 0.01), "hgrn2": (0.8, 0.05, 0.02)}, "context")}
    assert verdict("context", less).verdict == "against"
    stopped = study({"llama": (0.9, 0.05, 0.01), "cosformer2": (0.8, 0.5, 0.01)})
    stopped["runs"][0]["plateaued"] = False
    assert "not plateaued" in verdict("aspect", {"aspect": stopped}).why
    assert "no llama" in verdict("aspect", {"aspect": study({"cosformer2": (0.8, 0.5, 0.01)})}).why


def test_mossnet_claims_follow_the_numbers():
    def q(moss, llama, mamba, spread=0.005):
        return {"compare_quality": quality({a: [v - spread, v, v + spread]
                                            for a, v in (("mossnet", moss), ("llama", llama), ("mamba", mamba))})}

    assert verdict("mossnet-beats", q(3.0, 3.2, 3.1)).verdict == "for"
    assert verdict("mossnet-beats", q(3.0, 3.2, 2.9)).verdict == "mixed"
    assert verdict("mossnet-beats", q(3.3, 3.2, 3.1)).verdict == "against"
    assert verdict("mossnet-beats", q(3.2, 3.2, 3.2, spread=0.001)).verdict == "alike"  # within 0.01, shown to be
    one = {"compare_quality": quality({"mossnet": [3.0], "llama": [3.5], "mamba": [3.5]})}
    assert verdict("mossnet-beats", one).verdict == "cannot tell"
    assert verdict("constant-memory", {"decode": decode({"mossnet": (100, 100)})}).verdict == "for"
    assert verdict("constant-memory", {"decode": decode({"mossnet": (100, 400)})}).verdict == "against"


def test_experts_act_as_heads_against_one_wide_expert_and_equal_state():
    heads = mqar({"mossnet-E4-routed-k2": [0.8, 0.82, 0.81], "mossnet-E1-wide": [0.4, 0.42, 0.41],
                  "mamba-N64": [0.3, 0.31, 0.32]})
    v = verdict("heads", heads)
    assert v.verdict == "for" and [p.name for p in v.parts] == ["mossnet-E4-routed-k2 - mossnet-E1-wide",
                                                                 "mossnet-E4-routed-k2 - mamba-N64"]
    level = mqar({"mossnet-E4-routed-k2": [0.4, 0.7, 0.5], "mossnet-E1-wide": [0.5, 0.4, 0.6]})
    assert verdict("heads", level).verdict == "cannot tell"
    assert "E = 4, routed-k2" in verdict("heads", mqar({"mossnet-E1": [0.5] * 3})).why


def test_mossnet_scales_at_least_as_well_counts_alike_for_it():
    same = {"mossnet_fits": fits({"mossnet": -0.08, "llama": -0.08, "mamba": -0.081})}
    assert verdict("mossnet-scales", same).verdict == "for"
    worse = {"mossnet_fits": fits({"mossnet": -0.03, "llama": -0.08, "mamba": -0.081})}
    assert verdict("mossnet-scales", worse).verdict == "against"
    assert "did not run" in verdict("mossnet-scales", {}).why


def test_the_paper_claims_judge_the_papers_models_and_the_registrys_baseline(monkeypatch):
    from linlm.models import registry
    from linlm.models.registry import ARCHITECTURES

    monkeypatch.setitem(ARCHITECTURES, "toy", dataclasses.replace(ARCHITECTURES["tnl"], name="toy"))
    four = {"llama": -0.08, "tnl": -0.08, "hgrn2": -0.08, "cosformer2": -0.08}
    assert [p.name for p in verdict("scale-alike", fits(four)).parts] == [
        f"{a} - llama" for a in ("tnl", "hgrn2", "cosformer2")]
    v = verdict("scale-alike", fits({**four, "toy": -0.3}))  # a linear model the paper did not study: not judged
    assert v.verdict == "for" and [p.name for p in v.parts] == [f"{a} - llama" for a in ("tnl", "hgrn2", "cosformer2")]
    v = verdict("scale-alike", fits({**four, "cosformer2": -0.3}))  # one of the paper's three: judged
    assert v.verdict == "mixed" and "cosformer2 - llama against" in v.why
    monkeypatch.setitem(ARCHITECTURES, "toyssm", dataclasses.replace(ARCHITECTURES["mamba"], name="toyssm"))
    losses = {"mossnet": [3.0, 3.001, 3.002], "llama": [3.2, 3.201, 3.202], "toyssm": [2.9, 2.901, 2.902]}
    v = verdict("mossnet-beats", {"compare_quality": quality(losses)})  # MossNet's baselines: the registry's
    assert v.verdict == "mixed" and "mossnet - toyssm against" in v.why
    monkeypatch.setattr(registry, "baseline_arch", lambda: "mamba")
    v = verdict("weaker-retrieval", mqar({"mamba": [0.9, 0.91, 0.92], "tnl": [0.1, 0.11, 0.12]}))
    assert v.parts[0].name == "tnl - mamba"


def test_the_delta_rule_recalls_better_only_where_states_are_equal():
    equal = {"deltanet": 1024, "gated_deltanet": 1024, "hgrn2": 1024, "llama": 8192}
    strong = mqar({"llama": [0.95, 0.96, 0.97], "deltanet": [0.9, 0.91, 0.92], "gated_deltanet": [0.88, 0.9, 0.91],
                   "hgrn2": [0.3, 0.31, 0.33]}, states=equal)
    v = verdict("delta-recall", strong)
    assert v.verdict == "for" and [p.name for p in v.parts] == ["deltanet - hgrn2", "gated_deltanet - hgrn2"]
    assert "llama 0.960" in v.evidence and "hgrn2 1,024" in v.evidence
    weak = mqar({"deltanet": [0.3, 0.31, 0.33], "hgrn2": [0.9, 0.91, 0.92]}, states=equal)
    assert verdict("delta-recall", weak).verdict == "against"
    # The same accuracies at unequal states, or with no state recorded: that pair cannot tell, and says why.
    unequal = mqar({"deltanet": [0.9, 0.91, 0.92], "hgrn2": [0.3, 0.31, 0.33]}, states={"deltanet": 1152,
                                                                                       "hgrn2": 1024})
    v = verdict("delta-recall", unequal)
    assert v.verdict == "cannot tell" and "not at equal state: 1,152 against 1,024" in v.evidence
    v = verdict("delta-recall", mqar({"deltanet": [0.9, 0.91, 0.92], "hgrn2": [0.3, 0.31, 0.33]}))
    assert v.verdict == "cannot tell" and "state per layer not recorded for deltanet" in v.evidence
    v = verdict("delta-recall", mqar({"llama": [0.9, 0.91, 0.92], "hgrn2": [0.3, 0.31, 0.33]}, states=equal))
    assert v.verdict == "cannot tell" and "mqar trained no delta-rule model" in v.why


def test_a_hybrid_recovers_recall_when_above_its_linear_model_and_as_high_as_llama():
    tags = {"llama": {"hybrid": "attention"}, "hgrn2": {"hybrid": "linear"}, "hgrn2-attn4": {"hybrid": "hybrid"}}

    def hybrid(llama, linear, mixed, **kw):
        return mqar({"llama": llama, "hgrn2": linear, "hgrn2-attn4": mixed}, study=tags, **kw)

    v = verdict("hybrid", hybrid([0.90, 0.92, 0.94], [0.20, 0.22, 0.25], [0.91, 0.92, 0.935]))
    assert v.verdict == "for" and [p.name for p in v.parts] == ["hgrn2-attn4 - hgrn2", "hgrn2-attn4 - llama"]
    assert [p.outcome for p in v.parts] == ["for", "for"]  # the second by the equivalence test: as high as LLaMA
    # Above its linear model but well below LLaMA: the attention layer did not recover the recall.
    v = verdict("hybrid", hybrid([0.90, 0.92, 0.94], [0.20, 0.22, 0.25], [0.50, 0.53, 0.54]))
    assert v.verdict == "mixed" and [p.outcome for p in v.parts] == ["for", "against"]
    # A hybrid no better than its linear model.
    v = verdict("hybrid", hybrid([0.90, 0.92, 0.94], [0.50, 0.52, 0.55], [0.30, 0.31, 0.33]))
    assert [p.outcome for p in v.parts] == ["against", "against"]
    v = verdict("hybrid", hybrid([0.90, 0.92, 0.94], [0.20, 0.22, 0.25], [0.91, 0.92, 0.935],
                                 plateaued={"hgrn2-attn4": [True, False, True]}))
    assert v.verdict == "cannot tell" and "not plateaued: hgrn2-attn4 seed 1" in v.why
    v = verdict("hybrid", mqar({"llama": [0.9, 0.91], "hgrn2": [0.2, 0.21]}, study=tags))
    assert v.verdict == "cannot tell" and "trained no linear model beside its hybrid" in v.why


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.key)
def test_every_claim_names_the_sections_it_reads(claim):
    from linlm.reproduce import sections

    assert claim.reads and all(r in {s.name for s in sections.SECTIONS} for r in claim.reads), claim.reads
