"""Modules built on the meta device without their random initialisation: a model's shape alone, to count it or to
load weights into.

Under ``torch.device("meta")`` alone every ``nn.init`` call still runs: it computes nothing on the meta device, but
torch routes a meta tensor's ``normal_`` through its reference decompositions, whose first call imports
``torch._dynamo`` (and sympy with it). Measured on an AMD EPYC (Zen 5), torch 2.13.0: building the shell of a Mamba
of mamba-130m's shape added 71 MiB of private memory and 9 MiB of mapped files to the process, about a tenth of the
resident set of a decoding process (benchmarks/bench_llamacpp.py measures it). :func:`meta_device` skips those
calls: a meta tensor holds no values, so there is nothing for them to fill. Initial values that a module computes
(a decay per head, a frequency per channel) go through :func:`computed`, which on the meta device makes an empty
tensor of their shape instead: any arithmetic on a meta tensor takes the same route as ``normal_`` does (and
``linspace`` imports sympy).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch
from torch.nn import init
from torch.overrides import TorchFunctionMode

# What fills a tensor's values and nothing else: torch.nn.init's in-place initialisers and the random in-place
# methods of a tensor. Anything that changes a shape or a dtype is left alone.
_FILLERS = frozenset(
    [getattr(init, name) for name in dir(init) if name.endswith("_") and not name.startswith("_")]
    + [getattr(torch.Tensor, name) for name in ("normal_", "uniform_", "exponential_", "log_normal_", "cauchy_",
                                                "geometric_", "random_", "bernoulli_")])


class _SkipMetaFill(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FILLERS:
            # the tensor filled: the first argument (nn.init passes it by name, as ``tensor``)
            target = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


def computed(shape: tuple[int, ...], values: Callable[[], torch.Tensor],
             dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``values()``, a module's computed initial values of ``shape`` and ``dtype`` (None: torch's default dtype, as
    for values made without naming one); where tensors are made on the meta device, an empty tensor of that shape
    and dtype, without computing anything."""
    if torch.get_default_device().type == "meta":
        return torch.empty(shape, dtype=dtype)
    return values()


@contextlib.contextmanager
def meta_device():
    """``torch.device("meta")``, with the random initialisers of the modules built inside it skipped."""
    with torch.device("meta"), _SkipMetaFill():
        yield
