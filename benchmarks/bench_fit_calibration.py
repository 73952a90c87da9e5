"""Calibration of the L(N, D) fit: how close Chinchilla's parametric law comes to a known truth, and how often its
bootstrap intervals hold the truth, over many noise seeds.

Each seed draws a synthetic ladder from L(N, D) = E + A/N^a + B/D^b (Hoffmann et al.'s coefficients, E = 1.69):
--sizes sizes from 1e6 to 1e8 parameters, each trained to 20 tokens per parameter and logging its loss every
--interval tokens (so the smallest run logs 10 points, the largest 1,000, as a real ladder's fixed log interval
gives), with noise on log L of --noise (1 %) per point. Two noise models:

* ``iid``: independent noise at every logged point;
* ``ar1``: noise correlated along each run (an AR(1) with coefficient 0.95, the same 1 % marginal spread), as a
  training curve's is: one initialisation and one data order per run, and a smoothed loss.

Each method turns the runs into points, fits, and bootstraps 95 % intervals (--bootstrap resamples):

* ``before``: what `linlm scaling fit` did before: at most 20 log-spaced logged points per run (indices rounded,
  so a run of 10 points keeps 8), every point weighted alike, points resampled;
* every logged point, weighted alike or with runs weighted alike, with points or whole runs resampled; the
  default is what `linlm scaling fit` does now (linlm.scaling.fits_parametric.fit_runs_parametric).

For each method, noise model and parameter the table gives the mean and the largest relative error over the seeds,
and the coverage: the fraction of seeds whose interval holds the truth (nominal 95 %; with 20 seeds one miss is
5 %).

A second table calibrates the envelope fits a reproduce verdict rests on (linlm.scaling.fits_envelope,
fits_optimal) on ladders shaped like the cpu recipe's: its five sizes and budgets, logged every 102,400 tokens,
drawn from two known laws (E = 0, so the continuous envelope is a power law: alpha = -ab/(a+b)); each run off its
law by a constant seed offset (--seed-offset, 1 % of log L) and an AR(1) wiggle along the curve (--wiggle, 1 %,
coefficient 0.95). Architecture "a" trains a second seed of its three interior sizes, "b" one seed (its spread
pooled from a's), as the cpu recipe does for LLaMA and HGRN2 against TNL and cosFormer2. For --lc-seeds noise
seeds it gives the coverage of the 95 % intervals of alpha, of L_a - L_b at the common compute C* and of N_opt at
C*, before (every run its own curve with a centred 5-point mean; the envelope's points resampled for L(C), runs
resampled for N_opt(C)) and after (sizes' mean curves, log-log smoothing, seed replicates; N_opt read by a parabola
at C*). A draw a method refuses (too few interior points, an optimum at the edge of the sizes) is counted as
"cannot tell", not as a miss. Prints both tables and writes benchmarks/results/bench_fit_calibration.json.

    python benchmarks/bench_fit_calibration.py [--seeds 20] [--bootstrap 100] [--lc-seeds 100] [--lc-bootstrap 200]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, write_json  # noqa: E402

from linlm.scaling.fits import Curve, fit_parametric, fit_runs_parametric, parametric_points  # noqa: E402

TRUTH = {"E": 1.69, "A": 406.4, "B": 410.7, "a": 0.34, "b": 0.28}
AR1 = 0.95


def ladder(seed: int, sizes: int, interval: float, noise: float, model: str) -> list[Curve]:
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(np.geomspace(1e6, 1e8, sizes)):
        tokens = np.arange(interval, 20.0 * n + 1.0, interval)
        eps = rng.normal(0.0, noise, len(tokens))
        if model == "ar1":  # stationary AR(1) with marginal spread `noise`
            innov = eps * np.sqrt(1.0 - AR1 ** 2)
            eps[0] = rng.normal(0.0, noise)
            for k in range(1, len(eps)):
                eps[k] = AR1 * eps[k - 1] + innov[k]
        clean = TRUTH["E"] + TRUTH["A"] / n ** TRUTH["a"] + TRUTH["B"] / tokens ** TRUTH["b"]
        out.append(Curve(f"s{i}", "x", float(n), 6.0 * n, tokens, clean * np.exp(eps)))
    return out


def before(curves: list[Curve], bootstrap: int, seed: int):
    """The selection the fit used before: up to 20 log-spaced indices per run, rounded, duplicates dropped."""
    ns, ds, ls = [], [], []
    for cv in curves:
        t = cv.tokens
        idx = np.unique(np.round(np.geomspace(1, len(t), min(20, len(t)))).astype(int) - 1)
        ns.append(np.full(len(idx), cv.params))
        ds.append(t[idx])
        ls.append(cv.loss[idx])
    return fit_parametric(np.concatenate(ns), np.concatenate(ds), np.concatenate(ls), bootstrap=bootstrap, seed=seed)


def all_points(weighting: str, groups: bool):
    def method(curves: list[Curve], bootstrap: int, seed: int):
        p = parametric_points(curves, weighting=weighting)
        return fit_parametric(p.params, p.tokens, p.loss, weights=p.weight, groups=p.run if groups else None,
                              bootstrap=bootstrap, seed=seed)
    return method


def default(curves: list[Curve], bootstrap: int, seed: int):
    return fit_runs_parametric(curves, bootstrap=bootstrap, seed=seed)


METHODS = {"before": before,
           "all points, points weighted alike, points resampled": all_points("points", False),
           "all points, runs weighted alike, points resampled": all_points("runs", False),
           "all points, runs weighted alike, runs resampled": all_points("runs", True),
           "default: all points, points weighted alike, runs resampled": default}


# ---- L(C), the loss at a common compute and the optimal size: envelope fits on cpu-like ladders ----------------

# The cpu ladder's sizes and budgets (non-embedding parameters, tokens), logged every 102,400 tokens.
CPU_SIZES = ((0.016e6, 12e6), (0.033e6, 12e6), (0.056e6, 12e6), (0.16e6, 10e6), (0.44e6, 4.5e6))
CPU_INTERVAL = 102_400.0
# Two architectures of known laws (E = 0: the continuous envelope is an exact power law). "a" has a second seed
# of the three interior sizes (as the cpu recipe trains LLaMA's and HGRN2's); "b" one seed, its spread pooled.
LAWS = {"a": {"A": 406.4, "B": 410.7, "a": 0.34, "b": 0.28, "seeds": 2},
        "b": {"A": 380.0, "B": 450.0, "a": 0.32, "b": 0.29, "seeds": 1}}


def ar1_noise(rng, n: int, sigma: float, phi: float = AR1) -> np.ndarray:
    e = np.empty(n)
    e[0] = rng.normal(0.0, sigma)
    innovation = rng.normal(0.0, sigma * np.sqrt(1.0 - phi ** 2), n)
    for k in range(1, n):
        e[k] = phi * e[k - 1] + innovation[k]
    return e


def cpu_ladder(rng, arch: str, offset: float, wiggle: float) -> list[Curve]:
    """One architecture's ladder: each run's log loss off the law by a seed offset N(0, offset) and an AR(1)
    wiggle of spread ``wiggle``; the interior sizes trained ``seeds`` times."""
    law, out = LAWS[arch], []
    for i, (n, budget) in enumerate(CPU_SIZES):
        tokens = np.arange(CPU_INTERVAL, budget + 1.0, CPU_INTERVAL)
        clean = law["A"] / n ** law["a"] + law["B"] / tokens ** law["b"]
        for s in range(law["seeds"] if 0 < i < len(CPU_SIZES) - 1 else 1):
            eps = rng.normal(0.0, offset) + ar1_noise(rng, len(tokens), wiggle)
            out.append(Curve(f"{arch}{i}-s{s}", arch, float(n), 6.0 * n, tokens, clean * np.exp(eps), seed=s))
    return out


def true_optimum(arch: str, c_flops: float) -> tuple[float, float]:
    """(L, N) at the continuous optimum of the law at compute C = 6 N D."""
    from scipy.optimize import minimize_scalar

    law = LAWS[arch]
    f = lambda x: law["A"] / np.exp(x) ** law["a"] + law["B"] / (c_flops / 6 / np.exp(x)) ** law["b"]  # noqa: E731
    r = minimize_scalar(f, bounds=(np.log(1e3), np.log(1e9)), method="bounded")
    return float(r.fun), float(np.exp(r.x))


def true_alpha(arch: str) -> float:
    law = LAWS[arch]
    return -law["a"] * law["b"] / (law["a"] + law["b"])


def lc_after(curves: dict, bootstrap: int, seed: int) -> dict:
    """What `linlm scaling fit` does now: sizes' mean curves, log-log smoothing, seed replicates (b's spread pooled
    from a's), loss and optimum at the common compute (linlm.scaling.fits_optimal)."""
    from linlm.scaling.fits import compute_optimal, fit_envelope, measure_spread, sizes_of
    from linlm.scaling.fits_common import usable

    spread = measure_spread(sizes_of(usable(curves["a"], 5, 0.0)))
    fits = {a: fit_envelope(cs, smooth_window=5, bootstrap=bootstrap, seed=seed, spread=spread)
            for a, cs in curves.items()}
    opt = compute_optimal(fits)
    out = {"c": opt["compute_pflops_days"], "alpha": {a: f.loss.alpha_ci for a, f in fits.items()},
           "loss": {a: r.get("loss_samples") for a, r in opt["archs"].items()},
           "n_opt": {a: r.get("N_opt_samples") for a, r in opt["archs"].items()}}
    return out


def lc_before(curves: dict, bootstrap: int, seed: int) -> dict:
    """What it did before: every run its own curve (a centred 5-point mean), the envelope's points resampled for
    L(C), runs resampled for N_opt(C) read at the common compute (the top of the shortest fitted range)."""
    from linlm.scaling.fits import envelope_of, fit_power_law
    from linlm.scaling.fits_common import PFLOPS_DAY
    from linlm.scaling.fits_power import line
    from linlm.train.plot import smooth as centred_mean

    def rows(cs):
        return [(c, c.compute, np.asarray(centred_mean(c.loss.tolist(), 5)), c.tokens) for c in cs]

    out = {"alpha": {}, "loss": {}, "n_opt": {}, "laws": {}}
    tops = []
    for a, cs in curves.items():
        env = envelope_of(rows(cs), 60)
        use = env.interior
        if use.sum() < 3:
            return {"c": None}
        c = env.compute[use] / PFLOPS_DAY
        law = fit_power_law(c, env.loss[use], bootstrap=bootstrap, seed=seed)
        out["alpha"][a], out["laws"][a] = law.alpha_ci, law
        tops.append(c.max())
    out["c"] = cstar = min(tops)
    rng = np.random.default_rng(seed)
    for a, cs in curves.items():
        law = out["laws"][a]
        out["loss"][a] = [float(np.exp(lb + al * np.log(cstar))) for lb, al in law.samples]
        ns = []
        for _ in range(bootstrap):
            drawn = rows([cs[i] for i in rng.integers(0, len(cs), len(cs))])
            env = envelope_of(drawn, 60)
            use = env.interior
            if use.sum() < 3 or len(set(env.params[use].tolist())) < 2:
                continue
            lb, al, _ = line(np.log(env.compute[use] / PFLOPS_DAY), np.log(env.params[use]))
            ns.append(float(np.exp(lb + al * np.log(cstar))))
        out["n_opt"][a] = ns
    return out


def lc_calibration(seeds: int, bootstrap: int, offset: float, wiggle: float) -> tuple[list[dict], list[dict]]:
    """Coverage of the 95 % intervals of alpha (each architecture), of L_a - L_b at the common compute and of
    N_opt there (each architecture), before and after, over ``seeds`` noise seeds."""
    from linlm.scaling.fits_bootstrap import percentile_ci
    from linlm.scaling.fits_common import PFLOPS_DAY

    tallies: dict[tuple, dict] = {}
    per_seed = []
    for seed in range(seeds):
        rng = np.random.default_rng(10_000 + seed)
        curves = {a: cpu_ladder(rng, a, offset, wiggle) for a in LAWS}
        for method, fn in (("before", lc_before), ("after", lc_after)):
            try:
                got = fn(curves, bootstrap, seed)
            except Exception as e:  # noqa: BLE001 - a fit the method refuses is a "cannot tell", counted
                got = {"c": None, "error": str(e)}
            c = got.get("c")
            truth = {a: true_optimum(a, c * PFLOPS_DAY) for a in LAWS} if c else {}
            checks = {}
            for a in LAWS:
                checks[f"alpha ({a})"] = (got.get("alpha", {}).get(a), true_alpha(a))
                n = (got.get("n_opt") or {}).get(a)
                checks[f"N_opt at C* ({a})"] = (percentile_ci(np.log(n)) if n else None,
                                                np.log(truth[a][1]) if truth else None)
            la, lb = ((got.get("loss") or {}).get(a) for a in LAWS)
            m = min(len(la or []), len(lb or []))  # independent replicates: any pairing, the first m of each
            checks["L_a - L_b at C*"] = (percentile_ci(np.subtract(la[:m], lb[:m])) if m else None,
                                         truth["a"][0] - truth["b"][0] if truth else None)
            row = {"seed": seed, "method": method, "c": c}
            for q, (ci, want) in checks.items():
                t = tallies.setdefault((method, q), {"in": 0, "drawn": 0, "refused": 0, "widths": []})
                ok = ci is not None and want is not None and all(np.isfinite(ci))
                if not ok:
                    t["refused"] += 1
                    continue
                t["drawn"] += 1
                t["in"] += int(ci[0] <= want <= ci[1])
                t["widths"].append(float(ci[1] - ci[0]))
                row[q] = bool(ci[0] <= want <= ci[1])
            per_seed.append(row)
    rows = [{"method": m, "quantity": q, "coverage": t["in"] / t["drawn"] if t["drawn"] else None,
             "draws": t["drawn"], "refused (cannot tell)": t["refused"],
             "median CI width": float(np.median(t["widths"])) if t["widths"] else None}
            for (m, q), t in sorted(tallies.items(), key=lambda kv: (kv[0][1], kv[0][0] != "before"))]
    return rows, per_seed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--bootstrap", type=int, default=100)
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--sizes", type=int, default=6)
    ap.add_argument("--interval", type=float, default=2e6)
    ap.add_argument("--noise-models", default="iid,ar1")
    ap.add_argument("--lc-seeds", type=int, default=100, help="noise seeds of the L(C) calibration")
    ap.add_argument("--lc-bootstrap", type=int, default=200, help="replicates per fit in the L(C) calibration")
    ap.add_argument("--seed-offset", type=float, default=0.01, help="spread of a run's constant seed offset (log L)")
    ap.add_argument("--wiggle", type=float, default=0.01, help="spread of the AR(1) noise along a curve (log L)")
    ap.add_argument("--methods", default=";".join(METHODS), help="';'-separated names of METHODS")
    args = ap.parse_args()
    models = args.noise_models.split(",")
    methods = args.methods.split(";")
    per_seed: dict[str, list] = {}
    summary = []
    for model in models:
        for method in methods:
            started = time.perf_counter()
            rows = []
            for seed in range(args.seeds):
                fit = METHODS[method](ladder(seed, args.sizes, args.interval, args.noise, model), args.bootstrap, seed)
                got = {"E": fit.E, "A": fit.A, "B": fit.B, "a": fit.a, "b": fit.b}
                rows.append({"seed": seed, "n_points": fit.n_points, "fit": got,
                             "ci": {k: list(v) for k, v in fit.ci.items()}})
            seconds = time.perf_counter() - started
            per_seed[f"{method}/{model}"] = rows
            for key, truth in TRUTH.items():
                rel = np.array([r["fit"][key] / truth - 1.0 for r in rows])
                inside = [r["ci"][key][0] <= truth <= r["ci"][key][1] for r in rows if key in r["ci"]]
                summary.append({"method": method, "noise": model, "param": key, "truth": truth,
                                "mean_rel_error": float(rel.mean()), "max_abs_rel_error": float(np.abs(rel).max()),
                                "seeds_over_5pct": int((np.abs(rel) > 0.05).sum()),
                                "coverage": float(np.mean(inside)) if inside else None,
                                "n_points": rows[0]["n_points"], "seconds_per_fit": seconds / args.seeds})
    print_table(["method", "noise", "param", "mean rel err", "max |rel err|", "seeds > 5 %", "95 % coverage",
                 "points"],
                [[r["method"], r["noise"], r["param"], f"{100 * r['mean_rel_error']:+.1f} %",
                  f"{100 * r['max_abs_rel_error']:.1f} %", r["seeds_over_5pct"],
                  "" if r["coverage"] is None else f"{100 * r['coverage']:.0f} %", r["n_points"]] for r in summary])
    lc_rows, lc_per_seed = lc_calibration(args.lc_seeds, args.lc_bootstrap, args.seed_offset, args.wiggle)
    print()
    print_table(["method", "quantity", "95 % coverage", "draws", "refused", "median CI width"],
                [[r["method"], r["quantity"], "" if r["coverage"] is None else f"{100 * r['coverage']:.0f} %",
                  r["draws"], r["refused (cannot tell)"],
                  "" if r["median CI width"] is None else f"{r['median CI width']:.4g}"] for r in lc_rows])
    path = write_json("bench_fit_calibration", {"meta": meta(), "truth": TRUTH, "seeds": args.seeds,
                                                "bootstrap": args.bootstrap, "noise": args.noise,
                                                "sizes": args.sizes, "log_interval_tokens": args.interval,
                                                "ar1_coefficient": AR1, "summary": summary,
                                                "lc_ladder": {"sizes_and_tokens": [list(x) for x in CPU_SIZES],
                                                              "log_interval_tokens": CPU_INTERVAL,
                                                              "laws": LAWS, "seed_offset": args.seed_offset,
                                                              "wiggle": args.wiggle, "noise_seeds": args.lc_seeds,
                                                              "replicates": args.lc_bootstrap},
                                                "lc_coverage": lc_rows, "per_seed": per_seed,
                                                "lc_per_seed": lc_per_seed})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
