"""Text generation: prefill the prompt once, then decode token by token from the model's recurrent state
(or KV cache), sampling with temperature and top-k.

``load_for_generation(path)`` accepts a run directory (its newest valid checkpoint), a checkpoint directory, or a
directory written by ``model.save()``; the tokenizer is the ``tokenizer.json`` beside the weights unless one is
given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from linlm.errors import TokenizerError
from linlm.models.generation import generate, generate_ids, sample_token

__all__ = ["generate", "generate_ids", "sample_token", "load_for_generation"]


def load_for_generation(path: str | Path, tokenizer: Optional[str | Path] = None, device: str = "cpu"):
    """(model, tokenizer) from a run directory, a checkpoint directory or a saved model directory."""
    from linlm.data.tokenizer import Tokenizer
    from linlm.models.io import CONFIG, load
    from linlm.train.checkpoint import MANIFEST, resolve_checkpoint

    path = Path(path).expanduser()
    saved_model = (path / CONFIG).is_file() and not (path / MANIFEST).is_file()
    model_dir = path if saved_model else resolve_checkpoint(path)
    model = load(model_dir, device=device).eval()
    tok_path = Path(tokenizer) if tokenizer is not None else model_dir
    if tokenizer is None and not (model_dir / "tokenizer.json").is_file():
        raise TokenizerError(f"{model_dir}: no tokenizer.json beside the weights; pass --tokenizer PATH")
    tok = Tokenizer.from_pretrained(tok_path)
    tok.ensure_fits(model.config.vocab_size)
    return model, tok
