"""Reading a checkpoint directory of another library: its config.json and its weights, never running pickled code.

Weights are read from safetensors where the directory has them, else from PyTorch ``.bin`` files with
``torch.load(weights_only=True)``, which refuses anything but tensors and plain containers. Sharded checkpoints
(``*.index.json`` naming the shards) are read shard by shard. Every failure is one CheckpointError naming the file.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Iterable, Mapping

import torch

from linlm.errors import CheckpointError

CONFIG = "config.json"
# Weight files by preference: safetensors first, then PyTorch's pickles (read with weights_only=True).
SINGLE = ("model.safetensors", "pytorch_model.bin")
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# The tokenizer files a converted directory carries over unchanged.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _why(e: BaseException) -> str:
    """One line of an exception's message: the line naming what torch refused, else its first line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    named = [line for line in lines if "Unsupported global" in line]
    return (named or lines or [type(e).__name__])[0].split(". Please use")[0]


def read_json(path: Path, what: str = "config") -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found; a checkpoint directory holds a {CONFIG}") from None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: cannot be read as JSON ({e}); the {what} file is corrupt") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: holds a {type(data).__name__}, not a JSON object; the {what} file is corrupt")
    return data


def read_config(src: Path) -> dict:
    """config.json of a checkpoint directory (a one-line error when ``src`` is not one)."""
    src = Path(src)
    if not src.exists():
        raise CheckpointError(f"{src}: does not exist; pass a checkpoint directory (config.json and its weights)")
    if not src.is_dir():
        raise CheckpointError(f"{src}: is a file; pass the checkpoint directory that holds config.json and the weights")
    if not (src / CONFIG).is_file():
        raise CheckpointError(f"{src}: holds no {CONFIG}, so it is not a checkpoint directory; pass the directory a "
                              f"model was saved to (config.json and its weights)")
    return read_json(src / CONFIG)


def weight_files(src: Path) -> list[Path]:
    """The weight files of ``src``, in reading order (one file, or every shard an index names)."""
    for name in SINGLE:
        if (src / name).is_file():
            return [src / name]
    for name in INDEXES:
        index = src / name
        if index.is_file():
            weight_map = read_json(index, "weights index").get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index}: has no weight_map; the index is corrupt")
            shards = [src / s for s in dict.fromkeys(weight_map.values())]
            missing = [s.name for s in shards if not s.is_file()]
            if missing:
                raise CheckpointError(f"{index}: names shards that are missing ({', '.join(missing[:3])}); "
                                      f"the checkpoint is incomplete")
            return shards
    found = sorted(p.name for p in src.glob("*.safetensors")) or sorted(p.name for p in src.glob("*.bin"))
    if len(found) == 1:
        return [src / found[0]]
    raise CheckpointError(f"{src}: has a {CONFIG} but no weights (expected {' or '.join(SINGLE)}, or a sharded "
                          f"index); the checkpoint is incomplete")


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{path}: cannot be read as safetensors ({_why(e)}); the file is truncated or "
                                  f"corrupt") from None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path}: holds more than tensors and is refused (weights_only=True: {_why(e)}); convert "
                              f"it to safetensors with the library that wrote it") from None
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot be read as PyTorch weights ({_why(e)}); the file is truncated or "
                              f"corrupt") from None
    if isinstance(data, Mapping) and "state_dict" in data and isinstance(data["state_dict"], Mapping):
        data = data["state_dict"]
    if not isinstance(data, Mapping) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise CheckpointError(f"{path}: is not a state dict of tensors; pass a model's saved weights")
    return dict(data)


def read_weights(src: Path) -> "Tensors":
    src = Path(src)
    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(src):
        tensors.update(_read_file(path))
    return Tensors(tensors, src)


class Tensors(dict):
    """A source checkpoint's tensors. Reading a name it lacks is a CheckpointError, and :meth:`check_used`
    refuses tensors no converter read (a bias, an extra layer: weights that would otherwise be dropped)."""

    def __init__(self, data: Mapping[str, torch.Tensor], where):
        super().__init__(data)
        self.where = where
        self.used: set[str] = set()

    def __getitem__(self, key: str) -> torch.Tensor:
        if not dict.__contains__(self, key):
            raise CheckpointError(f"{self.where}: the weights have no tensor {key!r}, which config.json implies; "
                                  f"the weights are incomplete or belong to another model")
        self.used.add(key)
        return dict.__getitem__(self, key)

    def check_used(self, ignored: Iterable[str] = ()) -> None:
        left = sorted(set(self) - self.used - set(ignored))
        if left:
            shown = ", ".join(left[:4]) + (", ..." if len(left) > 4 else "")
            raise CheckpointError(f"{self.where}: {len(left)} tensors fit no part of the model config.json describes "
                                  f"({shown}); the weights belong to another layout or model")


def tokenizer_files(src: Path) -> list[Path]:
    """The tokenizer files of ``src`` to carry into the converted directory."""
    return [Path(src) / n for n in TOKENIZER_FILES if (Path(src) / n).is_file()]
