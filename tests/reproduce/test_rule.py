"""The one judging rule (linlm.reproduce.claims.rule): a known true difference gives "for", a known opposite one
"against", equal models "alike" only when the equivalence test passes, one seed "cannot tell", Holm's correction
counts over every difference of the report, and a claim with parts that disagree is "mixed". (The rate of false
verdicts on pure noise is measured by benchmarks/bench_verdicts.py, not here.)"""

from __future__ import annotations

import numpy as np
import pytest

from linlm.reproduce.claims.rule import (AGAINST, ALIKE, CANNOT, FOR, MIXED, Assessment, Difference, decide, holm,
                                         verdict_of)


def seeds(mean: float, spread: float, n: int = 3, base: float = 0.0) -> dict:
    """{seed: value}: ``n`` seeds around ``mean``, seed i off by base_i + spread * (i - (n-1)/2) (base: a shared
    per-seed offset, as seeds sharing a data order share it)."""
    return {i: mean + spread * (i - (n - 1) / 2) + base * (i % 2) for i in range(n)}


def judged(*parts: Difference) -> list[str]:
    decide([Assessment(list(parts))])
    return [p.outcome for p in parts]


def test_a_true_difference_is_for_and_its_opposite_against():
    lower = Difference("a - b", "loss", "nats", "lower", 0.01, a_values=seeds(2.0, 0.01), b_values=seeds(2.3, 0.01))
    assert judged(lower) == [FOR]
    assert lower.interval[1] < 0 and lower.p < 0.05 and lower.n == "3 seed pairs" and "paired" in lower.method
    higher = Difference("a - b", "loss", "nats", "lower", 0.01, a_values=seeds(2.3, 0.01), b_values=seeds(2.0, 0.01))
    assert judged(higher) == [AGAINST] and higher.interval[0] > 0


def test_equal_models_are_alike_only_when_the_equivalence_test_passes():
    # Seeds share their data order: a's and b's seed i move together, their differences are tiny.
    tight = Difference("a - b", "acc", "", "higher", 0.05, a_values=seeds(0.5, 0.2, base=0.1),
                       b_values={s: v + 0.001 * (-1) ** s for s, v in seeds(0.5, 0.2, base=0.1).items()})
    assert judged(tight) == [ALIKE] and tight.p_alike < 0.05
    # The same means with differences that scatter widely: no difference counts, and none is shown to be small.
    loose = Difference("a - b", "acc", "", "higher", 0.05, a_values={0: 0.3, 1: 0.7, 2: 0.5},
                       b_values={0: 0.6, 1: 0.4, 2: 0.5})
    assert judged(loose) == [CANNOT] and loose.p > 0.05 and loose.p_alike > 0.05
    # No margin: no "alike", however close.
    no_margin = Difference("a - b", "acc", "", "higher", None, a_values=dict(tight.a_values),
                           b_values=dict(tight.b_values))
    assert judged(no_margin) == [CANNOT]
    # A claim that there is no difference: alike is "for", a difference "against".
    alike_claim = Difference("a - b", "exponent", "", "alike", 0.05, a_values=dict(tight.a_values),
                             b_values=dict(tight.b_values))
    apart_claim = Difference("a - b", "exponent", "", "alike", 0.05, a_values=seeds(1.0, 0.01),
                             b_values=seeds(0.0, 0.01))
    assert judged(alike_claim, apart_claim) == [FOR, AGAINST]


def test_one_seed_cannot_tell_and_unpaired_seeds_use_welch():
    one = Difference("a - b", "loss", "nats", "lower", 0.01, a_values={0: 2.0}, b_values={0: 3.0})
    assert judged(one) == [CANNOT] and "one seed" in one.reason
    welch = Difference("a - b", "loss", "nats", "lower", 0.01, a_values={0: 2.0, 1: 2.01, 2: 2.02},
                       b_values={5: 3.0, 6: 3.01, 7: 3.02})
    assert judged(welch) == [FOR] and "Welch" in welch.method


def test_replicates_decide_by_their_interval():
    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 0.1, 1000), rng.normal(0.0, 0.1, 1000)
    apart = Difference("a - b", "exponent", "", "higher", 0.05, a_replicates=a, b_replicates=b, value=1.0)
    same = Difference("a - b", "exponent", "", "higher", 0.5, a_replicates=rng.normal(0.0, 0.1, 1000),
                      b_replicates=b, value=0.0)
    wide = Difference("a - b", "exponent", "", "higher", 0.05, a_replicates=rng.normal(0.1, 1.0, 1000),
                      b_replicates=b, value=0.1)
    assert judged(apart, same, wide) == [FOR, ALIKE, CANNOT]
    assert apart.p == pytest.approx(2 / 1001) and apart.interval[0] > 0.5
    few = Difference("a - b", "exponent", "", "higher", 0.05, a_replicates=[1.0] * 5, b_replicates=[0.0] * 5)
    assert judged(few) == [CANNOT] and "too few replicates" in few.reason


def test_holm_counts_the_kth_smallest_p_against_level_over_m_minus_k_plus_1():
    assert holm([0.01, 0.04, 0.03]) == [True, False, False]  # 0.01 <= 0.05/3; 0.03 > 0.05/2: stop
    assert holm([0.01, 0.02, 0.04]) == [True, True, True]  # 0.01 <= .0167, 0.02 <= .025, 0.04 <= .05
    assert holm([0.2, 0.001]) == [False, True]
    # The same difference alone counts; beside 19 others of p = 0.5 it must clear 0.05 / 20.
    p = Difference("a - b", "loss", "nats", "lower", None, a_values={0: 2.0, 1: 2.1, 2: 2.05},
                   b_values={0: 2.2, 1: 2.25, 2: 2.3})
    assert 0.0025 < p.p < 0.05
    assert judged(p) == [FOR]
    others = [Difference(f"x{i}", "loss", "nats", "lower", None, a_values={0: 1.0, 1: 2.0, 2: 1.5},
                         b_values={0: 1.5, 1: 1.4, 2: 1.6}) for i in range(19)]
    decide([Assessment([p]), Assessment(others)])
    assert p.outcome == CANNOT and "over 20 differences" in p.holm


def test_a_claim_with_parts_that_disagree_is_mixed_and_one_that_cannot_be_judged_says_why():
    up = Difference("x", "loss", "nats", "lower", 0.01, a_values=seeds(2.0, 0.01), b_values=seeds(2.3, 0.01))
    down = Difference("y", "loss", "nats", "lower", 0.01, a_values=seeds(2.3, 0.01), b_values=seeds(2.0, 0.01))
    both = Assessment([up, down])
    decide([both])
    assert verdict_of(both) == (MIXED, "x for, y against")
    agree = Assessment([Difference("x", "l", "", "lower", 0.01, a_values=seeds(2.0, 0.01), b_values=seeds(2.3, 0.01))])
    decide([agree])
    assert verdict_of(agree) == (FOR, None)
    assert verdict_of(Assessment(reason="the fits did not run")) == (CANNOT, "the fits did not run")
    one = Assessment([Difference("x", "l", "", "lower", 0.01, a_values={0: 1.0}, b_values={0: 2.0})])
    decide([one])
    verdict, why = verdict_of(one)
    assert verdict == CANNOT and "one seed" in why
