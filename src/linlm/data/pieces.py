"""The rule that cuts a corpus into pieces and assigns each to the training or the validation split.

Documents are cut into *pieces* of at most ``split_chars`` characters, at the last newline before
the limit (a hard cut when a line is longer). Pieces are numbered 0, 1, 2, ... in source order and piece ``j``
goes to validation when ``floor((j + 1) * f + u) > floor(j * f + u)``, with ``f = val_fraction`` and
``u`` in [0, 1) drawn from ``seed``: a systematic sample, so exactly ``floor(n * f + u)`` of ``n`` pieces are
validation, evenly spread through the corpus, and the rule needs neither the count in advance nor a second pass.
Cutting long documents into pieces is what gives a single file or a 42-work corpus a validation split at all.
"""

from __future__ import annotations

import math
import random
from typing import Iterable, Iterator

DEFAULT_SPLIT_CHARS = 8192


def is_val_piece(index: int, val_fraction: float, offset: float) -> bool:
    """Whether piece ``index`` goes to validation (the rule above)."""
    return math.floor((index + 1) * val_fraction + offset) > math.floor(index * val_fraction + offset)


def split_offset(seed: int) -> float:
    return random.Random(f"linlm-split-{seed}").random()


def iter_pieces(docs: Iterable[str], split_chars: int) -> Iterator[tuple[str, bool]]:
    """Cut documents into pieces of at most ``split_chars`` characters; yields (piece, is_last_piece_of_doc)."""
    for doc in docs:
        start, end_of_doc = 0, len(doc)
        while end_of_doc - start > split_chars:
            cut = doc.rfind("\n", start, start + split_chars)
            end = cut + 1 if cut > start else start + split_chars
            yield doc[start:end], False
            start = end
        yield doc[start:], True
