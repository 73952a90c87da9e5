"""Training: the loop, AdamW and schedules, checkpoints, DDP / FSDP2 under torchrun, the metrics log.

``train(cfg)`` runs a :class:`TrainConfig`; ``load_train_config(path, overrides)`` builds one. See
docs/training.md. Names are imported lazily so that ``import linlm.train`` stays cheap.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TrainConfig": "config", "load_train_config": "config", "build_config": "config",
    "train": "loop", "TrainResult": "loop", "TrainingDiverged": "loop",
    "save_checkpoint": "checkpoint", "load_checkpoint": "checkpoint", "latest_valid": "checkpoint",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"linlm.train.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'linlm.train' has no attribute {name!r}")
