"""Saving and loading models: safetensors weights plus a JSON config, never pickle.

A saved model is a directory holding ``model.safetensors`` and ``config.json``; the config carries the
weights' sha256. Loading checks the checksum, the names and the shapes before touching the model,
so a bad file never loads partially.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from linlm.errors import CheckpointError, ConfigError
from linlm.io_utils import commit_dir, sha256_file, temp_dir_beside

FORMAT = "linlm-model"
FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def save_model(model, path) -> Path:

    path = Path(path)
    tmp = temp_dir_beside(path)
    try:
        tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": FORMAT})
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "config": model.config.to_dict(),
            "weights_sha256": sha256_file(tmp / WEIGHTS),
        }
        (tmp / CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
        commit_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def read_config(path) -> tuple:
    from linlm.models.config import ModelConfig

    path = Path(path)
    cfg_file = path / CONFIG
    if not cfg_file.is_file():
        raise CheckpointError(f"{path}: no {CONFIG} found; expected a directory written by model.save()")
    try:
        meta = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_file}: not valid JSON ({e}); the checkpoint is corrupt, save it again") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{cfg_file}: not a linlm model config (missing format={FORMAT!r})")
    try:
        return ModelConfig.from_dict(meta.get("config", {})), meta
    except ConfigError as e:
        raise CheckpointError(f"{cfg_file}: invalid model config: {e}") from None


def load_weights(path, expected: dict[str, torch.Tensor], checksum: str | None) -> dict[str, torch.Tensor]:
    wfile = Path(path) / WEIGHTS
    if not wfile.is_file():
        raise CheckpointError(f"{path}: no {WEIGHTS} found; the checkpoint is incomplete")
    if checksum is not None and sha256_file(wfile) != checksum:
        raise CheckpointError(f"{wfile}: checksum mismatch (truncated or modified file); restore it or save again")
    try:
        tensors = load_file(str(wfile))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{wfile}: cannot be read as safetensors ({e}); the file is corrupt or truncated") from None
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{wfile}: weights do not match the config's architecture "
            f"(missing: {missing[:5]}, unexpected: {unexpected[:5]})"
        )
    for name, ref in expected.items():
        if tuple(tensors[name].shape) != tuple(ref.shape):
            raise CheckpointError(
                f"{wfile}: tensor {name!r} has shape {tuple(tensors[name].shape)}, the config needs {tuple(ref.shape)}"
            )
    return tensors


def load(path, device: str | torch.device = "cpu"):
    """Restore a model saved with ``model.save(path)``."""
    from linlm.models.lm import CausalLM

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: does not exist; pass a directory written by model.save()")
    cfg, meta = read_config(path)
    with torch.device("meta"):
        shell = CausalLM(cfg)
    tensors = load_weights(path, shell.state_dict(), meta.get("weights_sha256"))
    model = CausalLM(cfg)
    model.load_state_dict(tensors, strict=True)
    return model.to(device)
