"""Text generation: prefill the prompt once, then decode token by token from the model's recurrent state
(or KV cache), sampling with temperature, top-k and top-p (nucleus).

``load_for_generation(path)`` accepts a run directory (its newest valid checkpoint), a checkpoint directory, or a
directory written by ``model.save()``; the tokenizer is the one beside the weights unless one is given
(:func:`linlm.data.tokenizer.tokenizer_for_model`: linlm's own or a transformers tokenizer, with its BOS rule).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from linlm.errors import CheckpointError
from linlm.models.generation import (check_sampling, fit_prompt, generate, generate_ids, sample_token,
                                     stream_ids, stream_text)

__all__ = ["check_sampling", "fit_prompt", "generate", "generate_ids", "load_for_generation", "load_model",
           "sample_token", "stream_ids", "stream_text"]


def load_model(path: str | Path, device: str = "cpu"):
    """(model, directory) from a run directory (its newest valid checkpoint), a checkpoint directory, a directory
    from ``model.save()`` or one from ``save_pretrained`` of a linlm transformers model."""
    from linlm.devices import resolve_device
    from linlm.models.io import CONFIG, load
    from linlm.train.checkpoint import resolve_checkpoint
    from linlm.train.model_dirs import holds_saved_model

    dev = resolve_device(device)
    path = Path(path).expanduser()
    saved_model = holds_saved_model(path)
    model_dir = path if saved_model else resolve_checkpoint(path)
    hf_type = _hf_model_type(model_dir / CONFIG) if saved_model else None
    if hf_type is None:
        return load(model_dir, device=dev).eval(), model_dir
    from linlm.hf.modeling import MODEL_CLASSES

    arch = hf_type[len("linlm_"):]
    if arch not in MODEL_CLASSES:
        raise CheckpointError(f"{model_dir}: model_type {hf_type!r} is not a linlm architecture")
    return MODEL_CLASSES[arch].from_pretrained(model_dir).model.to(dev).eval(), model_dir


def load_for_generation(path: str | Path, tokenizer: Optional[str | Path] = None, device: str = "cpu"):
    """(model, tokenizer): the model as :func:`load_model`; the tokenizer as
    :func:`linlm.data.tokenizer.tokenizer_for_model` resolves it (beside the weights unless one is given), checked
    to fit the model's vocabulary."""
    from linlm.data.tokenizer import tokenizer_for_model

    model, model_dir = load_model(path, device)
    return model, tokenizer_for_model(model_dir, tokenizer, model.config.vocab_size)


def _hf_model_type(config_file: Path) -> Optional[str]:
    """The model_type of a transformers config.json written for a linlm model, else None."""
    import json

    try:
        meta = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return None
    kind = meta.get("model_type") if isinstance(meta, dict) else None
    return kind if isinstance(kind, str) and kind.startswith("linlm_") else None
