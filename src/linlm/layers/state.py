"""The decoding state of a whole model: one entry per layer, plus the position offset."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Optional, Sequence

import torch

from linlm.errors import ShapeError


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


def _zip_map(objs: Sequence[Any], fn):
    """fn(list of tensors) at every tensor position of structures of the same shape (the first one's)."""
    first = objs[0]
    if isinstance(first, torch.Tensor):
        return fn(list(objs))
    if isinstance(first, dict):
        return {k: _zip_map([o[k] for o in objs], fn) for k in first}
    if isinstance(first, (list, tuple)):
        return type(first)(_zip_map([o[i] for o in objs], fn) for i in range(len(first)))
    return first


def _row_offsets(offset, batch: int) -> torch.Tensor:
    return offset.long() if isinstance(offset, torch.Tensor) and offset.dim() == 1 else \
        torch.full((batch,), int(offset), dtype=torch.long)


def _compact(offsets: torch.Tensor):
    """Per-row offsets as one int when every row has the same (the usual case), else the LongTensor [B]."""
    return int(offsets[0]) if bool((offsets == offsets[0]).all()) else offsets


@dataclass
class ModelState:
    """Recurrent states (linear models) or KV caches (LLaMA) for a batch, after ``offset`` tokens: an int, or a
    LongTensor [B] when the rows hold sequences of different lengths (continuous batching: :meth:`join`,
    :meth:`select`)."""

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

    def select(self, rows) -> "ModelState":
        """The state of the rows ``rows`` (indices into the batch, in the order given): sequences leave a batch by a
        gather on every state tensor, whose rows are independent."""
        batch = self.batch_size
        idx = torch.as_tensor(rows, dtype=torch.long).reshape(-1)
        if batch is not None and idx.numel() and (int(idx.min()) < -batch or int(idx.max()) >= batch):
            raise ShapeError(f"rows {idx.tolist()} are not all rows of this state's batch of {batch}")
        picked = self.map(lambda t: t.index_select(0, idx.to(t.device)))
        offset = self.offset
        if isinstance(offset, torch.Tensor) and offset.dim() == 1:
            offset = _compact(offset.index_select(0, idx))
        return replace(picked, offset=offset)

    @staticmethod
    def join(states: Sequence["ModelState"]) -> "ModelState":
        """One state holding the rows of ``states`` one after the other (a sequence joins a batch): the tensors are
        concatenated along the batch, and rows of different lengths get per-row offsets. The states must come from
        one model; KV caches (LLaMA) must have the same length, since their positions are a dimension of the
        tensors (a recurrent state has no such dimension)."""
        states = list(states)
        if not states or not all(isinstance(s, ModelState) for s in states):
            raise ShapeError("join takes a non-empty list of ModelState objects")
        first = states[0]
        if any(s.signature != first.signature or len(s.layers) != len(first.layers) for s in states):
            raise ShapeError("join: the states come from different models; join states of one model only")

        def cat(ts):
            if any(t.shape[1:] != ts[0].shape[1:] for t in ts):
                raise ShapeError(f"join: state tensors of shapes {[tuple(t.shape) for t in ts]} differ beyond the "
                                 "batch (KV caches of sequences of different lengths); join them at equal lengths")
            return torch.cat(ts, dim=0)

        offsets = torch.cat([_row_offsets(s.offset, s.batch_size or 0) for s in states])
        return ModelState(_zip_map([s.layers for s in states], cat), _compact(offsets) if offsets.numel() else 0,
                          _zip_map([s.extra for s in states], cat), first.signature)

