"""Checkpoints of other libraries into linlm models, and back where the layout allows: one module per layout
(hf_llama, hf_mamba, mamba_ssm, fla_hgrn2), listed in registry.py; :func:`convert` is the one entry point, and
``linlm convert`` its command."""

from linlm.exports import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "convert": "linlm.conversion.convert", "detect": "linlm.conversion.convert",
    "load_foreign": "linlm.conversion.convert",
})
