"""Checkpoints of other libraries into linlm models, and back where the layout allows: one module per layout
(hf_llama, hf_mamba, mamba_ssm, fla_hgrn2), listed in registry.py; :func:`convert` is the one entry point, and
``linlm convert`` its command."""

from linlm.conversion.convert import convert, detect, load_foreign  # noqa: F401

__all__ = ["convert", "detect", "load_foreign"]
