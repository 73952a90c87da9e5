"""nn.Linear for decoding: the same module and state dict, whose forward computes inputs of a few rows (a decoding
step, batched or not) on linlm's matrix-vector kernel (linlm.ops.gemv_kernel) when no gradient is wanted, and
everything else with F.linear. CausalLM turns each of its nn.Linear layers into one (:func:`decode_linears`);
under torch.jit tracing, torch.compile and torch.export (the ONNX export traces through torch.export), and where the
kernel is not built, it is F.linear."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.ops.gemv_kernel import small_linear, small_linear_takes


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """F.linear(x, weight, bias), on the kernel where it takes the call (never while a graph is traced)."""
    if small_linear_takes(x, weight, bias):
        return small_linear(x, weight, bias)
    return F.linear(x, weight, bias)


class DecodeLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def decode_linears(module: nn.Module) -> None:
    """Make every plain nn.Linear inside ``module`` a DecodeLinear, in place (the class only: parameters, hooks and
    the state dict stay as they are)."""
    for m in module.modules():
        if type(m) is nn.Linear:
            m.__class__ = DecodeLinear


def has_hooks(m: nn.Module) -> bool:
    """Whether forward hooks are registered on ``m`` itself: a fused kernel that computes it in its place would skip
    them, so it must not."""
    return bool(m._forward_hooks or m._forward_pre_hooks)


def decode_weights(m: nn.Module):
    """(weight, int8 row scales or None, bias) of a projection that a fused decoding kernel may read in its place
    (linlm.ops.step_kernel): a plain nn.Linear or DecodeLinear (float weight, no scales; not a subclass, whose
    forward may differ) or a module with int8 weights, which says so by an ``int8()`` method returning (q, s) and
    has no bias (linlm.models.quant.QuantLinear); None for anything else, and for a module with forward hooks,
    which must run."""
    if has_hooks(m):
        return None
    if type(m) in (nn.Linear, DecodeLinear):
        return m.weight, None, m.bias
    int8 = getattr(m, "int8", None)
    if callable(int8):
        q, s = int8()
        return (q, s, None) if q is not None else None
    return None
