"""What a run takes from an earlier checkpoint before it trains: the model config a resumed run keeps
(:func:`as_saved`) and the weights ``init_from`` starts a new run with (:func:`load_initial_weights`). The full
resume (optimizer, data position, RNG) is the trainer's, once the model is built."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from linlm.errors import CheckpointError
from linlm.train import checkpoint as ckpt


def as_saved(model_config, checkpoint: Path, overrides: dict):
    """The model config to resume ``checkpoint`` with: a run started before an option's default changed
    (``ArchSpec.saved_before``) keeps computing what it computed, unless its config now sets that option.
    The checkpoint is verified later; an unreadable config.json changes nothing here."""
    from linlm.models.model_config import resume_options

    try:
        saved = json.loads((checkpoint / "config.json").read_text()).get("config", {})
    except (OSError, ValueError, AttributeError):
        return model_config
    return resume_options(model_config, saved, overrides)


def load_initial_weights(model: nn.Module, model_config, source: str) -> Path:
    """Load the weights of a checkpoint (or a run's newest) into the fresh ``model`` built from ``model_config``;
    returns the checkpoint's path. A checkpoint of another model, or with non-finite weights, is refused."""
    path = ckpt.resolve_checkpoint(source)
    weights = ckpt.load_model_weights(path)  # a model-only kept checkpoint will do: only the weights are read
    from linlm.models.model_config import ModelConfig

    # Read as a saved config, so that one written with the options' earlier flat spellings compares equal.
    theirs = ModelConfig.from_saved(json.loads((path / "config.json").read_text()).get("config", {})).to_dict()
    mine = model_config.to_dict()
    differ = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
    if differ:
        raise CheckpointError(f"init_from: {path} holds a model with a different {', '.join(differ[:6])} "
                              f"({', '.join(f'{k}={theirs.get(k)!r}' for k in differ[:6])}); use the model "
                              "settings it was trained with")
    if not all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point()):
        raise CheckpointError(f"init_from: {path} holds non-finite weights; choose an earlier checkpoint")
    model.load_state_dict(weights, strict=True)
    return path
