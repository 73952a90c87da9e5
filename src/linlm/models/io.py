"""Saving and loading models. The format itself (files, checksums, the refusal rules for saving) is in
models/format.py; this module adds :func:`load`, which builds the model and so sits above models/lm.py."""

from __future__ import annotations

from pathlib import Path

import torch

from linlm.errors import CheckpointError
from linlm.io_utils import MANIFEST, verify_manifest
from linlm.models.format import (CONFIG, FORMAT, FORMAT_VERSION, MODEL_FILES, WEIGHTS, config_checksum,  # noqa: F401
                                 load_weights, read_config, save_model, write_model_files)
from linlm.models.lm import CausalLM


def load(path, device: str | torch.device = "cpu") -> CausalLM:
    """Restore a model saved with ``model.save(path)``, or the model of a training checkpoint directory.

    Every checksum is verified first: a training checkpoint's manifest (every file it lists, config.json
    included), the model config's own ``config_sha256`` and the weights' sha256. Any mismatch is a CheckpointError.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: does not exist; pass a directory written by model.save()")
    if (path / MANIFEST).is_file():
        verify_manifest(path, required=MODEL_FILES)
    cfg, meta = read_config(path)
    with torch.device("meta"):
        shell = CausalLM(cfg)
    tensors = load_weights(path, shell.state_dict(), meta.get("weights_sha256"))
    model = CausalLM(cfg)
    model.load_state_dict(tensors, strict=True)
    return model.to(device)
