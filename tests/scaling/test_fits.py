"""Fits against known laws: synthetic runs with noise, and the paper's published coefficients."""

from __future__ import annotations

import math

import numpy as np
import pytest

from linlm.errors import DataError
from linlm.scaling.fits import (ONE_SIZE, PFLOPS_DAY, Curve, SeedSpread, crossover, crossover_between, envelope,
                                fit_envelope, fit_parametric, fit_power_law, fit_runs_parametric, isoflop)
from linlm.scaling.paper import PAPER_TABLE3, paper_law

# Hoffmann et al.'s fitted law (their Table A3 / approach 3); with E = 0 the compute-optimal envelope of
# L = A/N^a + B/D^b under C = 6 N D is exactly a power law: L ~ C^(-ab/(a+b)), N_opt ~ C^(b/(a+b)),
# D_opt ~ C^(a/(a+b)).
A, B, ALPHA, BETA = 406.4, 410.7, 0.34, 0.28


def law(n, d, e=0.0):
    return e + A / n ** ALPHA + B / d ** BETA


def synthetic(e=0.0, noise=0.005, sizes=20, seed=0, arch="x"):
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(np.geomspace(1e5, 1e8, sizes)):
        tokens = np.geomspace(1e6, 2000 * n, 150)
        loss = law(n, tokens, e) * np.exp(rng.normal(0.0, noise, len(tokens)))
        out.append(Curve(f"{arch}-{i}", arch, float(n), 6.0 * n, tokens, loss))
    return out


def within(got, want, rel):
    assert abs(got - want) <= rel * abs(want), f"{got} is not within {rel:.0%} of {want}"


# A seed spread as the fits measure one (1 % offset, 0.5 % AR(1) wiggle, measured on 4 degrees of freedom).
SPREAD = SeedSpread(offset=0.01, wiggle=0.005, phi=0.9, dof=4, sizes=4, source="test")


@pytest.mark.parametrize("seed", [0, 1])
def test_envelope_recovers_exponents_within_2_percent(seed):
    fit = fit_envelope(synthetic(seed=seed), bootstrap=100, seed=seed, spread=SPREAD)
    within(fit.loss.alpha, -ALPHA * BETA / (ALPHA + BETA), 0.02)
    within(fit.params.alpha, BETA / (ALPHA + BETA), 0.02)
    within(fit.tokens.alpha, ALPHA / (ALPHA + BETA), 0.02)
    assert fit.loss.r2 > 0.99
    lo, hi = fit.loss.alpha_ci
    assert lo < fit.loss.alpha < hi
    # The envelope never sits above any run at the compute it reports.
    env = fit.envelope
    assert np.all(np.diff(env.compute) > 0) and env.interior.any() and not env.interior.all()


@pytest.mark.parametrize("seed", [0, 1])
def test_isoflop_recovers_exponents_within_2_percent(seed):
    fit = isoflop(synthetic(seed=seed), levels=10, bootstrap=100, seed=seed)
    assert fit.params is not None and fit.tokens is not None
    within(fit.params.alpha, BETA / (ALPHA + BETA), 0.02)
    within(fit.tokens.alpha, ALPHA / (ALPHA + BETA), 0.02)
    assert sum(p.interior for p in fit.profiles) >= 3


def test_parametric_recovers_law_within_2_percent():
    curves = synthetic(e=1.69, noise=0.003, sizes=12)
    fit = fit_runs_parametric(curves, bootstrap=8)
    within(fit.a, ALPHA, 0.02)
    within(fit.b, BETA, 0.02)
    within(fit.E, 1.69, 0.05)
    assert fit.r2 > 0.99
    for key in ("a", "b", "E", "A", "B"):
        lo, hi = fit.ci[key]
        assert lo <= hi


def test_power_law_is_exact_on_exact_data_and_bootstrap_brackets():
    x = np.geomspace(1e-3, 1e3, 30)
    y = 2.5 * x ** -0.07 * np.exp(np.random.default_rng(3).normal(0, 0.002, 30))
    fit = fit_power_law(x, y, bootstrap=300)
    within(fit.alpha, -0.07, 0.02)
    within(fit.beta, 2.5, 0.01)
    assert fit.alpha_ci[0] < -0.07 < fit.alpha_ci[1]
    exact = fit_power_law(x, 2.5 * x ** -0.07, bootstrap=0)
    assert exact.r2 == pytest.approx(1.0) and exact.alpha == pytest.approx(-0.07)


# The crossover of y = b1 C^a1 and y = b2 C^a2 is C* = exp(ln(b2/b1) / (a1 - a2)). Worked by hand from Table 3:
#   TNL:        ln(3.5391/3.7087) = -0.046811; / (-0.0798 + 0.0768 = -0.0030) = 15.6035 -> C* = 5.97e6
#   HGRN2:      ln(3.4788/3.7087) = -0.063993; / (-0.0045) = 14.2207 -> C* = 1.50e6
#   cosFormer2: ln(3.5877/3.7087) = -0.033170; / (-0.0042) = 7.8977 -> C* = 2.69e3
# (PFLOP/s-days). Beyond C*, LLaMA's steeper law gives the lower loss.
PAPER_CROSSOVERS = {"tnl": 5.97e6, "hgrn2": 1.50e6, "cosformer2": 2.69e3}


@pytest.mark.parametrize("arch", sorted(PAPER_CROSSOVERS))
def test_crossover_from_paper_coefficients(arch):
    got = crossover(paper_law("llama"), paper_law(arch))
    within(got, PAPER_CROSSOVERS[arch], 0.005)
    c = crossover_between("llama", paper_law("llama"), arch, paper_law(arch))
    assert c.lower_after == "llama"
    assert paper_law("llama")(got * 10) < paper_law(arch)(got * 10)
    assert paper_law("llama")(got / 10) > paper_law(arch)(got / 10)


def test_crossover_reproduced_from_points_drawn_from_paper_laws():
    """Points on each paper law (with noise) are refitted; the fitted crossover lands near the paper's."""
    rng = np.random.default_rng(0)
    c = np.geomspace(1e-2, 1e3, 40)
    fits = {}
    for arch in ("llama", "hgrn2"):
        fits[arch] = fit_power_law(c, paper_law(arch)(c) * np.exp(rng.normal(0, 1e-4, len(c))), bootstrap=200)
        within(fits[arch].alpha, PAPER_TABLE3[arch]["L(C)"][1], 0.02)
    x = crossover_between("llama", fits["llama"], "hgrn2", fits["hgrn2"])
    # The crossover is an extrapolation far outside the data: its log moves by d(ln b)/d(alpha), so allow 25 %.
    within(x.compute, PAPER_CROSSOVERS["hgrn2"], 0.25)
    assert x.ci[0] < x.compute < x.ci[1]


def test_too_few_points_says_how_many():
    with pytest.raises(DataError, match="2 usable points, at least 3 are needed"):
        fit_power_law([1, 2], [3, 4])
    with pytest.raises(DataError, match="at least 8 are needed"):
        fit_parametric([1e6] * 4, [1e7] * 4, [3.0] * 4)
    two = synthetic(sizes=2)
    with pytest.raises(DataError, match="at least 3 are needed"):
        isoflop(two)
    with pytest.raises(DataError, match="at least 3 are needed"):
        fit_envelope(two, bootstrap=0)


def test_envelope_picks_lowest_run_and_converts_units():
    a = Curve("a", "x", 1e6, 6e6, [1e6, 1e7], [5.0, 4.0])
    b = Curve("b", "x", 2e6, 12e6, [1e6, 1e7], [4.5, 3.0])
    env = envelope([a, b], points=5)
    assert env.compute[0] == pytest.approx(6e12) and env.compute[-1] == pytest.approx(1.2e14)
    # At 6e12 FLOPs only run a has been logged; at the end only b; in between, b (lower) wins where both exist.
    assert env.run[0] == "a" and env.run[-1] == "b"
    assert math.isclose(PFLOPS_DAY, 8.64e19)


def test_an_envelope_on_one_size_is_refused():
    """When every bracketed envelope point lies on one size, L(C) is one run's learning curve and N_opt(C) flat by
    construction: the fit is refused ("cannot tell: one size"), and the analysis says why."""
    compute = np.geomspace(1e9, 1e12, 40)
    curves = []
    for n, loss in ((1e4, lambda c: 3.0 + 0 * c), (2e4, lambda c: 2.0 * (c / 1e9) ** -0.05),
                    (4e4, lambda c: 3.5 + 0 * c)):
        curves.append(Curve(f"r{int(n)}", "x", n, 6 * n, compute / (6 * n), loss(compute)))
    with pytest.raises(DataError, match=f"{ONE_SIZE}: every fitted envelope point lies on one size "
                                        r"\(20,000 parameters\)"):
        fit_envelope(curves, bootstrap=0)

    from linlm.scaling.analysis import FitOptions, fit_arch

    out = fit_arch("x", curves, FitOptions(bootstrap=0, parametric_bootstrap=0))
    assert out.envelope is None and ONE_SIZE in out.errors["envelope"] and out.env is not None


def test_two_runs_of_one_size_with_one_seed_are_one_run_given_twice():
    runs = synthetic(sizes=4)
    twin = Curve("copy", "x", runs[1].params, runs[1].paper_flops_per_token, runs[1].tokens, runs[1].loss, seed=0)
    runs[1].seed = 0
    with pytest.raises(DataError, match=r"runs x-1 and copy: one size .* trained twice with seed 0"):
        fit_envelope([*runs, twin], bootstrap=0)


def test_a_fit_without_a_seed_spread_has_no_interval_and_one_with_seeds_measures_its_own():
    plain = fit_envelope(synthetic(sizes=8), bootstrap=20)
    assert plain.spread is None and np.isnan(plain.loss.alpha_ci).all() and plain.loss.samples is None
    rng = np.random.default_rng(5)
    seeded = synthetic(sizes=8)
    for c in seeded[2:6]:  # a second seed of four sizes, 1 % off in level
        seeded.append(Curve(c.name + "-s1", "x", c.params, c.paper_flops_per_token, c.tokens,
                            c.loss * np.exp(rng.normal(0, 0.01)), seed=1))
        c.seed = 0
    fit = fit_envelope(seeded, bootstrap=40)
    assert fit.spread is not None and fit.spread.dof == 4 and fit.spread.source == "its own seeds"
    assert fit.replicates + fit.failed == 40 and len(fit.loss.samples) == fit.replicates
    d = fit.to_dict()
    assert d["runs"] == 12 and d["sizes"] == 8 and d["replicates"]["spread"]["dof"] == 4
    assert len(d["L(C)"]["samples"]) == fit.replicates and sum(d["envelope"]["fitted"]) == d["points"]
