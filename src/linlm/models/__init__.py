"""The generic causal LM, the architectures and their registry, the model config, presets, counting, saving and
loading."""

from linlm.exports import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "CausalLM": "linlm.models.lm", "LMOutput": "linlm.models.lm", "create_model": "linlm.models.lm",
    "ModelConfig": "linlm.models.model_config", "load": "linlm.models.io", "ArchSpec": "linlm.models.archs.base",
    "register": "linlm.models.registry", "ARCHITECTURES": "linlm.models.registry",
    "PRESETS": "linlm.models.presets", "count": "linlm.models.counting",
})
