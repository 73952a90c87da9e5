"""When to skip an autograd.Function: its apply has a cost per call even under no_grad, which adds up at batch-1
decoding (tens of calls per token), so the ops' wrappers run their forward computation directly when autograd does
not record the call."""

from __future__ import annotations

import torch


def needs_grad(*tensors) -> bool:
    """Whether autograd records a call on these tensors (None entries are ignored)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
