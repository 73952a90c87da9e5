"""The decoding state of a whole model: one entry per layer, plus the position offset."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

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
    # What the state's shape depends on (arch, n_layers, widths), set by the model that made it; a model refuses a
    # state whose signature differs from its own. None for a state built by hand (then only its layer count and
    # batch size are checked).
    signature: Optional[dict[str, Any]] = None

    @property
    def batch_size(self) -> Optional[int]:
        """The batch dimension of the first tensor (every state tensor is batch-first); None when there is none."""
        first = next(_tensors([self.layers, self.extra]), None)
        return None if first is None else first.shape[0]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _tensors([self.layers, self.extra]))
