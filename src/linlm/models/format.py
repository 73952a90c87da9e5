"""The saved-model format: safetensors weights plus a JSON config, never pickle.

A saved model is a directory holding ``model.safetensors`` and ``config.json``. config.json carries the sha256 of
the weights and of the model config itself (``config_sha256``, over the config's canonical JSON), so that an edited
config (say norm_eps) is refused instead of loading a model that computes something else. Loading checks both
checksums, the names and the shapes before touching the model, so a bad file never loads partially. A training
checkpoint is a saved model plus more files, all listed with their checksums in its manifest.json.

Saving never removes what linlm did not write (:func:`save_model`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from linlm.errors import CheckpointError, ConfigError, LinlmError
from linlm import outputs
from linlm.io_utils import sha256_file
from linlm.models.model_config import ModelConfig

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


def write_model_files(directory: Path, state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any],
                      quantization: Mapping[str, Any] | None = None) -> None:
    """Write model.safetensors and config.json (with both checksums) into ``directory``; ``quantization`` (a
    quantized model's description, linlm.models.quant) is stored beside the config."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": FORMAT})
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": dict(config),
        "config_sha256": config_checksum(config),
        "weights_sha256": sha256_file(directory / WEIGHTS),
    }
    if quantization is not None:
        meta["quantization"] = dict(quantization)
    (directory / CONFIG).write_text(outputs.dumps(meta, indent=2), encoding="utf-8")


def is_model_dir(path: Path) -> bool:
    """True when ``path/config.json`` is a linlm model config (a saved model or a training checkpoint)."""
    try:
        meta = json.loads((Path(path) / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def check_save_target(path: Path, overwrite: bool, also: tuple[str, ...] = ()) -> None:
    """Refuse a target whose contents linlm did not write (one-line CheckpointError; nothing is changed). ``also``
    names files beside MODEL_FILES that the save writes too (a converted model's tokenizer files)."""
    if path.is_symlink():
        raise CheckpointError(f"{path}: is a symbolic link; save to the directory it points to, or to a new path")
    if not path.exists():
        return
    if not path.is_dir():
        raise CheckpointError(f"{path}: is an existing file; a saved model is a directory, so choose a new path "
                              f"(nothing was written)")
    entries = sorted(p.name for p in path.iterdir() if not outputs.bookkeeping(p.name))
    if not entries:
        return
    if not is_model_dir(path):
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise CheckpointError(f"{path}: is a non-empty directory that is not a saved linlm model (it holds {shown}); "
                              f"choose a new or empty directory (nothing was written)")
    if not overwrite:
        raise CheckpointError(f"{path}: holds a saved model already; pass overwrite=True to replace it, "
                              f"or choose a new path (nothing was written)")
    foreign = sorted(set(outputs.foreign_entries(path)) | {n for n in entries if n not in (*MODEL_FILES, *also)})
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise CheckpointError(f"{path}: also holds files linlm's model.save() did not write, or that were changed "
                              f"since ({shown}); move them out or save to a new path, since overwrite=True replaces "
                              f"the directory whole (nothing was written)")


def save_model(model, path, *, overwrite: bool = False, files: tuple[Path, ...] = ()) -> Path:
    """Save ``model`` (its state dict and ``model.config``) as a directory at ``path``, atomically.

    ``path`` must be new, an empty directory, or (with ``overwrite=True``) a directory holding a saved model and
    nothing else. A file, a directory of other things, or a saved model with files of the user's in it is refused
    with a CheckpointError and left untouched. The new directory is written beside ``path`` and swapped in whole.
    ``files`` are copied into it unchanged, under their own names (a converted checkpoint's tokenizer files).
    """
    path = Path(path)
    files = tuple(Path(f) for f in files)
    check_save_target(path, overwrite, tuple(f.name for f in files))
    try:
        tmp = outputs.temp_dir_beside(path)
    except (OSError, LinlmError) as e:
        if isinstance(e, LinlmError):
            raise CheckpointError(str(e)) from None
        raise CheckpointError(f"{path}: cannot be written ({e.strerror or e}); choose a writable directory "
                              f"(nothing was written)") from None
    try:
        quantization = getattr(model, "quantization", None)
        write_model_files(tmp, model.state_dict(), model.config.to_dict(),
                          **({"quantization": quantization} if quantization is not None else {}))
        for f in files:
            (tmp / f.name).write_bytes(f.read_bytes())
        outputs.commit_dir(tmp, path)
    except BaseException as e:
        outputs.discard(tmp)
        if isinstance(e, OSError):
            raise CheckpointError(f"{path}: the model could not be saved ({e.strerror or e}); free disk space or "
                                  f"fix the permissions, then save again (whatever was at {path} is unchanged)") from e
        raise
    return path


def foreign_layout(meta: Mapping[str, Any]) -> str:
    """What checkpoint of another library a config.json describes ("a transformers 'mamba' checkpoint", "a mamba_ssm
    checkpoint"), or "" when it is none of them."""
    if "model_type" in meta and not str(meta["model_type"]).startswith("linlm"):
        return f"a transformers {meta['model_type']!r} checkpoint"
    if {"d_model", "n_layer", "vocab_size"} <= set(meta):
        return "a mamba_ssm checkpoint"
    return ""


def read_config(path) -> tuple[ModelConfig, dict]:
    """(ModelConfig, the whole config.json) of a saved model directory, its config checksum verified."""
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
    try:
        return ModelConfig.from_saved(config), meta
    except ConfigError as e:
        raise CheckpointError(f"{cfg_file}: invalid model config: {e}") from None


def load_weights(path, expected: dict[str, torch.Tensor], checksum: str | None) -> dict[str, torch.Tensor]:
    wfile = Path(path) / WEIGHTS
    if not wfile.is_file():
        raise CheckpointError(f"{path}: no {WEIGHTS} found; the checkpoint is incomplete")
    if checksum is not None and sha256_file(wfile) != checksum:
        raise CheckpointError(f"{wfile}: checksum mismatch (truncated or modified file); restore it or save again")
    try:
        tensors = _mapped_tensors(wfile)
        if tensors is None:
            tensors = load_file(str(wfile))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{wfile}: cannot be read as safetensors ({e}); the file is corrupt or truncated") from None
    check_tensors(wfile, tensors, expected)
    return tensors


_DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16,
           "I8": torch.int8, "U8": torch.uint8, "I32": torch.int32, "I64": torch.int64, "BOOL": torch.bool}


def _mapped_tensors(wfile: Path) -> dict[str, torch.Tensor] | None:
    """The tensors of a safetensors file as views of one private memory map of it (copy on write: the file is never
    changed), so that loading holds each weight once: safetensors' ``load_file`` copies out of its own map, and the
    map's pages count in the resident set beside the copies until it is closed, twice the weights at the peak.
    The layout is safetensors' own: an 8-byte little-endian header length, a JSON header of name -> dtype, shape and
    byte range, then the data. None when the file is anything else (``load_file`` then says what is wrong)."""
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
    storage = torch.UntypedStorage.from_file(str(wfile), shared=False, nbytes=size)
    start, out = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info.get("dtype")) if isinstance(info, dict) else None
        if dtype is None:
            return None
        shape, (lo, hi) = list(info["shape"]), info["data_offsets"]
        itemsize = torch.empty((), dtype=dtype).element_size()
        numel = 1
        for d in shape:
            numel *= d
        if hi - lo != numel * itemsize or start + hi > size or (start + lo) % itemsize:
            return None
        out[name] = torch.empty(0, dtype=dtype).set_(storage, (start + lo) // itemsize, shape)
    return out


def check_tensors(where, tensors: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
                  hint: str = "weights do not match the config's architecture") -> None:
    """Every name of ``expected`` in ``tensors``, no other, each of the expected shape (one-line CheckpointError)."""
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{where}: {hint} (missing: {missing[:5]}, unexpected: {unexpected[:5]})")
    for name, ref in expected.items():
        if tuple(tensors[name].shape) != tuple(ref.shape):
            raise CheckpointError(
                f"{where}: tensor {name!r} has shape {tuple(tensors[name].shape)}, the config needs {tuple(ref.shape)}"
            )
