"""Lower bounds on the memory a model needs to run or train at a given batch and length, from its config alone.

Used before a command allocates by a user's number (:func:`linlm.resources.check_memory`): a bound that is
certainly exceeded by the real run, so that a refusal is never wrong. What each one counts:

- the parameters, counted on the meta device (nothing allocated), times the bytes of one element;
- inference (a prefill of ``batch x tokens``): the hidden states entering and leaving a block, both alive at
  once: ``2 * batch * tokens * d_model`` elements;
- training (a step of ``batch x seq_len``): weights, gradients and AdamW's two moments in float32
  (``4 * params * 4`` bytes), each block's input kept for the backward pass (``n_layers * batch * seq_len *
  d_model``) and the logits (``batch * seq_len * vocab_size``).

Attention's KV cache, the GLU's and the mixers' intermediates and the allocator's slack all come on top; the real
peak is several times these.
"""

from __future__ import annotations

import dataclasses
import json

from linlm.models.model_config import ModelConfig

_PARAMS: dict[str, int] = {}


def parameter_count(cfg: ModelConfig) -> int:
    """Every parameter of the model (embedding included), counted on the meta device; cached per config."""
    key = json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str)
    if key not in _PARAMS:
        from linlm.models.counting import meta_model

        _PARAMS[key] = sum(p.numel() for p in meta_model(cfg).parameters())
    return _PARAMS[key]


def inference_floor(cfg: ModelConfig, batch: int, tokens: int, element_bytes: int = 4) -> int:
    """Bytes a forward pass over ``batch x tokens`` needs at least (see the module doc)."""
    return element_bytes * (parameter_count(cfg) + 2 * batch * tokens * cfg.d_model)


def training_floor(cfg: ModelConfig, batch: int, seq_len: int, element_bytes: int = 4) -> int:
    """Bytes one training step over ``batch x seq_len`` needs at least (see the module doc)."""
    tokens = batch * seq_len
    return 16 * parameter_count(cfg) + element_bytes * tokens * (cfg.n_layers * cfg.d_model + cfg.vocab_size)
