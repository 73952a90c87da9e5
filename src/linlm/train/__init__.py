"""Training: the Trainer, AdamW and schedules, checkpoints, DDP / FSDP2 under torchrun, the metrics log.

``Trainer(cfg, hooks=..., data=...).run()`` (or ``train(cfg)``) runs a :class:`TrainConfig`;
``build_config(path, overrides)`` / ``load_train_config(path, ["key=value"])`` build one. See docs/training.md.
Names are imported when first used, so that ``import linlm.train`` stays cheap.

The package is callable: ``linlm.train(cfg)`` is ``linlm.train.train(cfg)`` (:func:`linlm.train.trainer.train`), so
that ``linlm.train`` is what a user calls whether or not this package was imported before.
"""

from __future__ import annotations

import sys
import types

from linlm.exports import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "TrainConfig": "linlm.train.train_config", "load_train_config": "linlm.train.config_sources",
    "build_config": "linlm.train.config_sources",
    "Trainer": "linlm.train.trainer", "TrainHooks": "linlm.train.trainer", "TrainResult": "linlm.train.trainer",
    "train": "linlm.train.trainer", "TrainData": "linlm.train.pipeline",
    "save_checkpoint": "linlm.train.checkpoint", "load_checkpoint": "linlm.train.checkpoint",
    "latest_valid": "linlm.train.checkpoint", "TrainingDiverged": "linlm.errors",
})


class _TrainPackage(types.ModuleType):
    """This package's type: a module that trains when called."""

    def __call__(self, *args, **kwargs):
        return self.train(*args, **kwargs)


sys.modules[__name__].__class__ = _TrainPackage
