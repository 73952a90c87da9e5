"""Training: the Trainer, AdamW and schedules, checkpoints, DDP / FSDP2 under torchrun, the metrics log.

``Trainer(cfg, hooks=..., data=...).run()`` (or ``train(cfg)``) runs a :class:`TrainConfig`;
``build_config(path, overrides)`` / ``load_train_config(path, ["key=value"])`` build one. See docs/training.md.
Names are imported lazily so that ``import linlm.train`` stays cheap.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TrainConfig": "train_config", "load_train_config": "config_sources", "build_config": "config_sources",
    "Trainer": "trainer", "TrainHooks": "trainer", "TrainResult": "trainer", "train": "trainer",
    "TrainData": "pipeline",
    "save_checkpoint": "checkpoint", "load_checkpoint": "checkpoint", "latest_valid": "checkpoint",
}

__all__ = sorted([*_EXPORTS, "TrainingDiverged"])


def __getattr__(name: str):
    if name == "TrainingDiverged":  # lives in linlm.errors
        from linlm.errors import TrainingDiverged

        return TrainingDiverged
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"linlm.train.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'linlm.train' has no attribute {name!r}")
