"""Helpers shared by the trainer tests (imported as a module; fixtures live in conftest.py)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

WORDS = ("the king queen lord lady sword crown castle night day love death war peace heart blood gold fair foul "
         "speak hath thou thee doth good ill").split()


def make_text(n_lines: int = 2500, seed: int = 0) -> str:
    """Sentences with structure (a capital, words from a small set, a full stop) so that a model can learn."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
        lines.append(" ".join(words).capitalize() + ".")
    return "\n".join(lines) + "\n"


def tiny_config_dict(data_dir: Path, out_dir: Path, **top) -> dict:
    """A config that trains in about a second: a 2-layer LLaMA of width 32 on 32-token sequences."""
    cfg = {
        "model": {"arch": "llama", "overrides": {"n_layers": 2, "d_model": 32, "n_heads": 2, "glu_dim": 64,
                                                  "max_seq_len": 128}},
        "data": {"dir": str(data_dir), "seq_len": 32},
        "optim": {"lr": 1e-2},
        "schedule": {"kind": "cosine", "warmup_steps": 2},
        "eval": {"every": 4, "batches": 2},
        "checkpoint": {"every": 2, "keep": 3},
        "samples": {"prompts": [], "max_new_tokens": 0},
        "out_dir": str(out_dir),
        "steps": 8,
        "batch_size": 4,
        "threads": 1,
        "log_every": 1,
        "seed": 0,
    }
    for key, value in top.items():
        node = cfg
        *parents, leaf = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return cfg


def write_yaml(path: Path, data: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    env.pop("CI", None)
    return env


def run_cli(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``python -m linlm ARGS`` in a subprocess."""
    return subprocess.run([sys.executable, "-m", "linlm", *args], env=cli_env(), capture_output=True, text=True,
                          **kwargs)


def final_weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    from linlm.train.checkpoint import latest_valid

    return load_file(str(latest_valid(Path(run_dir) / "checkpoints", quarantine=False) / "model.safetensors"))


def assert_bitwise_equal(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"tensor {k} differs"
