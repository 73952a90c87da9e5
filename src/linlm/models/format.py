"""The saved-model format: safetensors weights plus a JSON config, never pickle.

A saved model is a directory holding ``model.safetensors`` and ``config.json``. config.json carries the sha256 of
the weights and of the model config itself (``config_sha256``, over the config's canonical JSON), so that an edited
config (say norm_eps) is refused instead of loading a model that computes something else. Loading checks both
checksums, the names and the shapes before touching the model, so a bad file never loads partially. A training
checkpoint is a saved model plus more files, all listed with their checksums in its manifest.json.

Saving never removes what linlm did not write (:func:`save_model`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from linlm.errors import CheckpointError, ConfigError, LinlmError
from linlm import outputs
from linlm.io_utils import sha256_file
# the on-disk names and checks, read without torch (also by linlm.infer.lean); re-exported for the callers here
from linlm.models.files import (CONFIG, FORMAT, FORMAT_VERSION, ITEMSIZE, MODEL_FILES, WEIGHTS,  # noqa: F401
                                config_checksum, foreign_layout, read_meta, tensor_layout)
from linlm.models.model_config import ModelConfig


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
        raise CheckpointError(f"{path}: holds a saved model already; pass overwrite=True (a command's --overwrite) to "
                              "replace it, or choose a new path (nothing was written)")
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


def read_config(path) -> tuple[ModelConfig, dict]:
    """(ModelConfig, the whole config.json) of a saved model directory, its config checksum verified."""
    meta = read_meta(path)
    try:
        return ModelConfig.from_saved(meta.get("config", {})), meta
    except ConfigError as e:
        raise CheckpointError(f"{Path(path) / CONFIG}: invalid model config: {e}") from None


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
    None when the file is not one files.tensor_layout reads (``load_file`` then says what is wrong)."""
    layout = tensor_layout(wfile)
    if layout is None:
        return None
    storage = torch.UntypedStorage.from_file(str(wfile), shared=False, nbytes=wfile.stat().st_size)
    return {name: torch.empty(0, dtype=_DTYPES[dtype]).set_(storage, offset // ITEMSIZE[dtype], shape)
            for name, (dtype, shape, offset) in layout.items()}


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
