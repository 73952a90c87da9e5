"""Section results of the shapes the claims read (imported as a module): fits with seed replicates, MQAR runs per
seed, the comparison's validation losses per seed, a decode profile."""

from __future__ import annotations

from typing import Optional

import numpy as np


def fits(alphas: dict, *, sd: float = 0.002, c_star: Optional[float] = 1e-7, losses: Optional[dict] = None,
         optimum: Optional[dict] = None, errors: Optional[dict] = None, n: int = 400, seed: int = 0) -> dict:
    """A fits section: each architecture's L(C) exponent ``alphas[arch]`` with ``n`` replicates of spread ``sd``;
    at C*, its loss ``losses[arch] = (loss, sd)`` and its optimum ``optimum[arch] = (N, D, sd of log)``;
    ``errors[arch]``: why its fit was refused."""
    rng = np.random.default_rng(seed)
    archs = {}
    for arch, alpha in alphas.items():
        samples = [[1.0, float(a)] for a in rng.normal(alpha, sd, n)]
        archs[arch] = {"envelope": {"L(C)": {"alpha": alpha, "beta": 3.0, "r2": 0.99, "samples": samples},
                                    "runs": 7, "sizes": 5, "points": 30,
                                    "replicates": {"drawn": n, "used": n, "failed": 0,
                                                   "spread": {"source": "its own seeds"}}},
                       "errors": {}}
    for arch, why in (errors or {}).items():
        archs[arch] = {"envelope": None, "errors": {"envelope": why}}
    rows = {}
    for arch, (loss, lsd) in (losses or {}).items():
        rows[arch] = {"loss": loss, "loss_samples": rng.normal(loss, lsd, n).tolist(), "N_opt": None,
                      "why": "the optimum lies outside the sampled sizes"}
    for arch, (n_opt, d_opt, lsd) in (optimum or {}).items():
        row = rows.setdefault(arch, {"loss": 2.0, "loss_samples": [2.0] * n})
        row.update({"N_opt": n_opt, "D_opt": d_opt, "why": None,
                    "N_opt_samples": np.exp(rng.normal(np.log(n_opt), lsd, n)).tolist(),
                    "D_opt_samples": np.exp(rng.normal(np.log(d_opt), lsd, n)).tolist()})
    return {"archs": archs, "runs": [{"run": "x", "arch": "llama", "params": 2e4}, {"run": "y", "arch": "llama",
                                                                                   "params": 4e5}],
            "compute_optimal": {"compute_pflops_days": c_star, "why": None if c_star else "they do not overlap",
                                "archs": rows}}


def mqar(acc: dict, *, chance: float = 0.01, width: int = 64, plateaued=True, study: Optional[dict] = None,
         pairs: int = 16, states: Optional[dict] = None) -> dict:
    """An MQAR section: ``acc[config] = [accuracy of seed 0, 1, ...]`` at ``width``; ``plateaued``: True, False,
    or {config: [per seed]}; ``study[config] = {tag: value}`` (a shape or a context) for a study's runs, whose
    config names are ``ARCH@TAG``; ``states[config]``: its state per layer (floats), recorded when given."""
    runs = []
    for config, values in acc.items():
        arch, _, tag = config.partition("@")
        for seed, a in enumerate(values):
            flat = plateaued.get(config, [True] * len(values))[seed] if isinstance(plateaued, dict) else plateaued
            runs.append({"name": f"{arch if study else config}-d{width}", "arch": arch.split("-")[0],
                         "d_model": width, "seed": seed, "accuracy": a, "plateaued": flat, "steps": 1000,
                         "study": (study or {}).get(config, {}),
                         **({"state_per_layer": states[config]} if states and config in states else {})})
    return {"task": {"num_kv": pairs, "vocab_size": 128}, "chance": chance, "runs": runs}


def quality(losses: dict, params: Optional[dict] = None) -> dict:
    """A compare_quality section: ``losses[arch] = [val loss of seed 0, 1, ...]``."""
    return {"models": {f"{a}-r-s{i}": {"arch": a, "seed": i, "val_loss": v, "params": (params or {}).get(a, 1000)}
                       for a, vs in losses.items() for i, v in enumerate(vs)}}


def decode(states: dict) -> dict:
    """A decode section: ``states[arch] = (state bytes at 16, at 64 tokens)``."""
    return {"rows": [{"arch": a, "context": n, "state_bytes": s, "error": None}
                     for a, (lo, hi) in states.items() for n, s in ((16, lo), (64, hi))]}
