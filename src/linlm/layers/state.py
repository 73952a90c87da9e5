"""The decoding state of a whole model: one entry per layer, plus the position offset."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


def _tensors(obj: Any):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


@dataclass
class ModelState:
    """Recurrent states (linear models) or KV caches (LLaMA) for a batch, after ``offset`` tokens."""

    layers: list[Any]
    offset: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _tensors([self.layers, self.extra]))
