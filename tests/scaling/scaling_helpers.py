"""Helpers for the scaling tests (imported as a module): synthetic sweep directories whose runs follow a known law,
written as `linlm scaling run` writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

A, B, ALPHA, BETA = 406.4, 410.7, 0.34, 0.28


def write_run(root: Path, name: str, arch: str, params: float, tokens, loss, *, tokenizer: str = "bpe:1024",
              finished: bool = True, flops_key: str = "paper_flops_per_token", seed: Optional[int] = None) -> Path:
    """``flops_key``: the name of the FLOPs per token in scaling.json (``flops_per_token`` in older files);
    ``seed``: the train config's seed, written to config.yaml (the fits tell seeds of one size apart by it)."""
    run = root / "runs" / name
    run.mkdir(parents=True)
    if seed is not None:
        (run / "config.yaml").write_text(f"seed: {seed}\n")
    tokens = list(tokens)
    last = tokens[-1] if tokens else 0
    meta = {"ladder": "synthetic", "arch": arch, "rung": name, "params": params, flops_key: 6.0 * params,
            "head_flops_per_token": 0.0, "tokens_per_step": tokens[0] if tokens else 1, "steps": len(tokens), "tokens": last,
            "data": {"source": "synthetic", "tokenizer": tokenizer, "source_fingerprint": "s0",
                     "tokenizer_fingerprint": tokenizer, "train_tokens": 10 * last, "epochs": 0.1}}
    (run / "scaling.json").write_text(json.dumps(meta))
    with open(run / "metrics.jsonl", "w") as f:
        for i, (t, l) in enumerate(zip(tokens, loss), 1):
            f.write(json.dumps({"step": i, "tokens": t, "loss": l}) + "\n")
    done = len(tokens) if finished else len(tokens) // 2
    (run / "summary.json").write_text(json.dumps({"step": done, "interrupted": None if finished else "SIGINT"}))
    return run


def synthetic_sweep(root: Path, archs=("llama", "tnl"), sizes: int = 10, noise: float = 0.003, seed: int = 0,
                    seeded: tuple = (3, 4, 5, 6)):
    """Arch k's runs follow L = A/N^a + B'/D^b_k with b_k = BETA (1 + 0.1 k): the fitted L(C) cross. The first
    architecture trains the sizes ``seeded`` twice (``ARCH-I-s1``, train seed 1): the seed spread the fits'
    intervals are drawn from (the others' is pooled from it)."""
    rng = np.random.default_rng(seed)
    for k, arch in enumerate(archs):
        b_coef = B * (1.0 + 0.3 * k)
        for i, n in enumerate(np.geomspace(1e5, 1e8, sizes)):
            # Logged from the first steps to 2000 tokens per parameter (thinned geometrically to 150 records).
            tokens = np.geomspace(1e5, 2000 * n, 150).round()
            for s in range(2 if k == 0 and i in seeded else 1):
                noisy = np.exp(rng.normal(0, noise) + rng.normal(0, noise, len(tokens)))
                loss = (A / n ** ALPHA + b_coef / tokens ** arch_beta(k)) * noisy
                write_run(root, f"{arch}-{i}" + (f"-s{s}" if s else ""), arch, float(n), tokens.tolist(),
                          loss.tolist(), seed=s)
    return root


def arch_beta(k: int) -> float:
    return BETA * (1.0 + 0.1 * k)
