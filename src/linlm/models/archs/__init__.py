"""One module per architecture: its ArchSpec (what it builds, its norm, its FLOP formula, its preset rule, its
validation). The registry (models/registry.py) lists them, one line each."""

from linlm.exports import exports

__all__, __getattr__, __dir__ = exports(__name__, {})
