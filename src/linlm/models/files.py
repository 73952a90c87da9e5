"""A saved model's files as they are on disk, read without torch: the names, the config.json checks and the
safetensors layout. linlm.models.format builds on them (the ModelConfig, the tensors); linlm.infer.lean reads a model
with them in a process that never imports torch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from linlm.errors import CheckpointError

__all__ = ["CONFIG", "FORMAT", "FORMAT_VERSION", "ITEMSIZE", "MODEL_FILES", "WEIGHTS", "config_checksum",
           "foreign_layout", "read_meta", "tensor_layout"]

FORMAT = "linlm-model"
# 1: weights_sha256 only. 2: config_sha256 as well (required from version 2 on).
FORMAT_VERSION = 2
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
# The files a saved model directory consists of: the only ones save_model(overwrite=True) replaces.
MODEL_FILES = (WEIGHTS, CONFIG)


def config_checksum(config: Mapping[str, Any]) -> str:
    """sha256 of the config's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(dict(config), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def foreign_layout(meta: Mapping[str, Any]) -> str:
    """What checkpoint of another library a config.json describes ("a transformers 'mamba' checkpoint", "a mamba_ssm
    checkpoint"), or "" when it is none of them."""
    if "model_type" in meta and not str(meta["model_type"]).startswith("linlm"):
        return f"a transformers {meta['model_type']!r} checkpoint"
    if {"d_model", "n_layer", "vocab_size"} <= set(meta):
        return "a mamba_ssm checkpoint"
    return ""


def read_meta(path) -> dict:
    """The whole config.json of a saved model directory: a linlm model's, its model config's checksum verified (the
    config itself is not yet validated: linlm.models.format.read_config builds the ModelConfig)."""
    path = Path(path)
    cfg_file = path / CONFIG
    if not cfg_file.is_file():
        raise CheckpointError(f"{path}: no {CONFIG} found; expected a directory written by model.save()")
    try:
        meta = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_file}: not valid JSON ({e}); the checkpoint is corrupt, save it again") from None
    if isinstance(meta, dict) and meta.get("format") != FORMAT and foreign_layout(meta):
        raise CheckpointError(f"{cfg_file}: describes {foreign_layout(meta)}, not a linlm model; convert it first: "
                              f"linlm convert {path} --out DIR (or linlm.convert in Python), then load DIR")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{cfg_file}: not a linlm model config (missing format={FORMAT!r})")
    config = meta.get("config", {})
    if not isinstance(config, dict):
        raise CheckpointError(f"{cfg_file}: 'config' is not a mapping; the file is corrupt, save the model again")
    want = meta.get("config_sha256")
    if want is None and meta.get("format_version", 1) >= 2:
        raise CheckpointError(f"{cfg_file}: config_sha256 is missing; the file was edited or is corrupt, "
                              f"restore it or save the model again")
    if want is not None and config_checksum(config) != want:
        raise CheckpointError(f"{cfg_file}: the model config does not match its config_sha256 (edited or corrupt); "
                              f"restore the file, or build the model you want and save it again")
    return meta


# Bytes per element of each safetensors dtype.
ITEMSIZE = {"F32": 4, "F64": 8, "BF16": 2, "F16": 2, "I8": 1, "U8": 1, "I32": 4, "I64": 8, "BOOL": 1}


def tensor_layout(wfile: Path) -> dict[str, tuple[str, list[int], int]] | None:
    """{name: (safetensors dtype, shape, byte offset in the file)} of a safetensors file, every tensor's byte range
    checked against its shape, its alignment and the file's size. The layout is safetensors' own: an 8-byte
    little-endian header length, a JSON header of name -> dtype, shape and byte range, then the data. None when the
    file is anything else (or holds a dtype outside ITEMSIZE)."""
    size = wfile.stat().st_size
    with open(wfile, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return None
        n = int.from_bytes(head, "little")
        if n > size - 8:
            return None
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            return None
    if not isinstance(header, dict):
        return None
    start, out = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        itemsize = ITEMSIZE.get(info.get("dtype")) if isinstance(info, dict) else None
        if itemsize is None:
            return None
        shape, (lo, hi) = list(info["shape"]), info["data_offsets"]
        numel = 1
        for d in shape:
            numel *= d
        if hi - lo != numel * itemsize or start + hi > size or (start + lo) % itemsize:
            return None
        out[name] = (info["dtype"], shape, start + lo)
    return out
