"""``linlm.load`` and ``linlm.convert`` as users call them: a training run's directory (or its ``checkpoints/``, or
one of its checkpoints) stands for its newest checkpoint that verifies, wherever a model directory is accepted.

The rule lives here, in the train layer, because the run directory's layout is train's; ``linlm.models.io.load`` and
``linlm.conversion.convert.convert`` below read one model directory as given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

__all__ = ["convert", "load", "model_dir"]


def model_dir(path: str | Path) -> Path:
    """The directory to read for ``path``: itself when it holds a saved model (``model.save()``, ``save_pretrained``
    or another library's checkpoint: a config.json and no training manifest), else the newest checkpoint of the run
    that verifies (a CheckpointError names what is missing). Any other path is returned as it is, for the reader's
    own error."""
    from linlm.models.io import CONFIG
    from linlm.train.checkpoint import MANIFEST, resolve_checkpoint

    path = Path(path).expanduser()
    if (path / CONFIG).is_file() and not (path / MANIFEST).is_file():
        return path
    if (path / MANIFEST).is_file() or (path / "checkpoints").is_dir() or path.name == "checkpoints":
        return resolve_checkpoint(path)
    return path


def load(path: str | Path, device: str | torch.device = "cpu"):
    """The model saved at ``path`` (:func:`linlm.models.io.load`), where ``path`` may also be a training run's
    directory: its newest checkpoint that verifies is loaded."""
    from linlm.models.io import load as load_dir

    return load_dir(model_dir(path), device=device)


def convert(src, out, *, layout: Optional[str] = None, to: Optional[str] = None, overwrite: bool = False) -> Path:
    """:func:`linlm.conversion.convert.convert`, where ``src`` may also be a training run's directory (with ``to``:
    its newest checkpoint that verifies is converted)."""
    from linlm.conversion.convert import convert as convert_dir

    return convert_dir(model_dir(src), out, layout=layout, to=to, overwrite=overwrite)
