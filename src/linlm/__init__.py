"""linlm: linear-complexity language models (MossNet, TNL, HGRN2, cosFormer2) with LLaMA and Mamba baselines.

What a user calls, each imported when first used (``import linlm`` imports neither torch nor transformers)::

    model = linlm.create_model("tnl", preset="tiny")     # or linlm.load(path), linlm.convert(...)
    linlm.train(linlm.train.load_train_config("configs/demo.yaml"))
    text = linlm.generate(model, tokenizer, "To be")     # linlm.evaluate, linlm.perplexity
    linlm.register(SPEC)                                 # a new architecture (linlm.ArchSpec, linlm.TokenMixer)

``linlm.train`` is both the training package and the function that trains (calling the package calls
:func:`linlm.train.trainer.train`). The user-facing errors are :mod:`linlm.errors`.
"""

from linlm import errors
from linlm.exports import exports
from linlm.version import __version__

__all__, __getattr__, __dir__ = exports(__name__, {
    "create_model": "linlm.models.lm", "load": "linlm.train.model_dirs", "convert": "linlm.conversion.cli",
    "generate": "linlm.models.generation", "evaluate": "linlm.eval.evaluator", "perplexity": "linlm.eval.perplexity",
    "register": "linlm.models.registry", "train": "linlm.train:",
    "ModelConfig": "linlm.models.model_config", "CausalLM": "linlm.models.lm", "LMOutput": "linlm.models.lm",
    "PRESETS": "linlm.models.presets", "ARCHITECTURES": "linlm.models.registry", "ArchSpec": "linlm.models.archs.base",
    "TokenMixer": "linlm.layers.mixer",
})
__all__ += ["errors", "__version__"]
