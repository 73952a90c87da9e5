"""The decoding state of a whole model: one entry per layer, plus the position offset."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

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


def _map(obj: Any, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(v, fn) for v in obj)
    return obj


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

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor of the state (the layers' first, then the extra ones)."""
        return _tensors([self.layers, self.extra])

    @property
    def batch_size(self) -> Optional[int]:
        """The batch dimension of the first tensor (every state tensor is batch-first); None when there is none."""
        first = next(self.tensors(), None)
        return None if first is None else first.shape[0]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def map(self, fn) -> "ModelState":
        """A new state with ``fn`` applied to every tensor (each is batch-first: ``lambda t: t.index_select(0, i)``
        picks rows), keeping the offset and the signature."""
        return ModelState(_map(self.layers, fn), self.offset, _map(self.extra, fn), self.signature)
