"""``linlm.load`` as users call it: a training run's directory (or its ``checkpoints/``, or one of its checkpoints)
stands for its newest checkpoint that verifies, wherever a model directory is accepted.

The rule (:func:`model_dir`) lives here, in the train layer, because the run directory's layout is train's;
``linlm.models.io.load`` below reads one model directory as given. ``linlm.convert`` applies the same rule in
conversion/cli.py, which may import this layer (train imports nothing of conversion).
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["holds_saved_model", "load", "model_dir"]


def holds_saved_model(path: Path) -> bool:
    """Whether ``path`` holds a saved model (``model.save()``, ``save_pretrained`` or another library's checkpoint):
    a config.json and no training manifest. Anything else is a run, its checkpoints, or not a model."""
    from linlm.models.io import CONFIG
    from linlm.train.checkpoint import MANIFEST

    return (path / CONFIG).is_file() and not (path / MANIFEST).is_file()


def model_dir(path: str | Path) -> Path:
    """The directory to read for ``path``: itself when it holds a saved model (``model.save()``, ``save_pretrained``
    or another library's checkpoint: a config.json and no training manifest), else the newest checkpoint of the run
    that verifies (a CheckpointError names what is missing). Any other path is returned as it is, for the reader's
    own error."""
    from linlm.train.checkpoint import MANIFEST, resolve_checkpoint

    path = Path(path).expanduser()
    if holds_saved_model(path):
        return path
    if (path / MANIFEST).is_file() or (path / "checkpoints").is_dir() or path.name == "checkpoints":
        return resolve_checkpoint(path)
    return path


def load(path: str | Path, device: str | torch.device = "cpu"):
    """The model saved at ``path`` (:func:`linlm.models.io.load`), where ``path`` may also be a training run's
    directory: its newest checkpoint that verifies is loaded."""
    from linlm.models.io import load as load_dir

    return load_dir(model_dir(path), device=device)

