"""Tensor functions, one module each (gla, selective_scan, routing, fused, the C kernels and GPU backends); their
names are the modules' own (``from linlm.ops.gla import gla``), so the package exports none."""

from linlm.exports import exports

__all__, __getattr__, __dir__ = exports(__name__, {})
