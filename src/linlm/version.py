"""linlm's version: one place, below every layer, so that any module may record it (``import linlm`` would reach the
public face at the top of the layers)."""

__version__ = "0.1.0"
