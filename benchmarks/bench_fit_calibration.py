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

A second table measures the interval of the envelope's N_opt(C) exponent (linlm.scaling.fits_envelope) on
ladders of 6 and 10 sizes: resampling the envelope's points, its width and coverage depend on the grid the
envelope is read at (60 or 240 points); resampling runs, they do not. Prints both tables and writes
benchmarks/results/bench_fit_calibration.json.

    python benchmarks/bench_fit_calibration.py [--seeds 20] [--bootstrap 100] [--noise 0.01] [--envelope-bootstrap 200]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, write_json  # noqa: E402

from linlm.scaling.fits import Curve, fit_envelope, fit_parametric, fit_runs_parametric, parametric_points  # noqa: E402

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


def envelope_ladder(seed: int, sizes: int, noise: float) -> list[Curve]:
    """Runs of L = A/N^a + B/D^b (E = 0, so the envelope's laws are exact power laws), 150 log-spaced points."""
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(np.geomspace(1e5, 1e8, sizes)):
        tokens = np.geomspace(1e5, 2000 * n, 150)
        clean = TRUTH["A"] / n ** TRUTH["a"] + TRUTH["B"] / tokens ** TRUTH["b"]
        out.append(Curve(f"s{i}", "x", float(n), 6.0 * n, tokens, clean * np.exp(rng.normal(0.0, noise, 150))))
    return out


def envelope_calibration(seeds: int, bootstrap: int, noise: float) -> list[dict]:
    """Coverage of the N_opt(C) exponent's interval, envelope points or runs resampled, at two grid sizes."""
    want = TRUTH["b"] / (TRUTH["a"] + TRUTH["b"])
    rows = []
    for sizes in (6, 10):
        for points in (60, 240):
            for resample in ("points", "runs"):
                inside, widths, errors = [], [], []
                for seed in range(seeds):
                    fit = fit_envelope(envelope_ladder(seed, sizes, noise), points=points, smooth_window=5,
                                       bootstrap=bootstrap, seed=seed, resample=resample)
                    lo, hi = fit.params.alpha_ci
                    inside.append(lo <= want <= hi)
                    widths.append(hi - lo)
                    errors.append(abs(fit.params.alpha / want - 1.0))
                rows.append({"sizes": sizes, "grid_points": points, "resampled": resample, "truth": want,
                             "max_abs_rel_error": float(max(errors)), "median_ci_width": float(np.median(widths)),
                             "coverage": float(np.mean(inside))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--bootstrap", type=int, default=100)
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--sizes", type=int, default=6)
    ap.add_argument("--interval", type=float, default=2e6)
    ap.add_argument("--noise-models", default="iid,ar1")
    ap.add_argument("--envelope-bootstrap", type=int, default=200)
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
    envelope_rows = envelope_calibration(args.seeds, args.envelope_bootstrap, args.noise)
    print()
    print_table(["sizes", "grid points", "resampled", "max |rel err|", "median CI width", "95 % coverage"],
                [[r["sizes"], r["grid_points"], r["resampled"], f"{100 * r['max_abs_rel_error']:.1f} %",
                  f"{r['median_ci_width']:.3f}", f"{100 * r['coverage']:.0f} %"] for r in envelope_rows])
    path = write_json("bench_fit_calibration", {"meta": meta(), "truth": TRUTH, "seeds": args.seeds,
                                                "bootstrap": args.bootstrap, "noise": args.noise,
                                                "sizes": args.sizes, "log_interval_tokens": args.interval,
                                                "ar1_coefficient": AR1, "summary": summary,
                                                "envelope_n_opt": envelope_rows, "per_seed": per_seed})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
