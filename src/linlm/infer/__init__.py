"""Generation (generate.py: loading a model for it, sampling), profiling and export."""

from linlm.exports import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "load_model": "linlm.infer.generate", "load_for_generation": "linlm.infer.generate",
})
