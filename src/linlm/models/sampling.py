"""What sampling text shares with or without torch (linlm.models.generation, linlm.infer.lean): the range checks
of the sampling settings, and the text pieces of a stream of token ids."""

from __future__ import annotations

import math
from typing import Iterable, Iterator

from linlm.errors import ConfigError

__all__ = ["check_sampling", "text_pieces"]


def check_sampling(temperature: float, top_k: int, top_p: float = 1.0, max_new_tokens: int = 0) -> None:
    """Raise ConfigError for sampling settings out of range (before any work)."""
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"temperature: must be a finite number >= 0 (0 is greedy), got {temperature}")
    if top_k < 0:
        raise ConfigError(f"top_k: must be >= 0 (0 keeps every token), got {top_k}")
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ConfigError(f"top_p: must be in (0, 1] (1 keeps every token), got {top_p}")
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens: must be >= 0, got {max_new_tokens}")


def text_pieces(tokenizer, ids: Iterable[int]) -> Iterator[str]:
    """The text of the token ids as they come, in pieces (stops at the tokenizer's end-of-text id): each piece is the
    new text since the last one, and a token that only completes part of a multi-byte character yields nothing
    until the character is whole."""
    new: list[int] = []
    shown = ""
    for token in ids:
        if token == tokenizer.eos_id:
            break
        new.append(token)
        text = tokenizer.decode(new)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence so far
            continue
        if text.startswith(shown):
            piece, shown = text[len(shown):], text
            if piece:
                yield piece
    text = tokenizer.decode(new)
    if text != shown and text.startswith(shown):
        yield text[len(shown):]
