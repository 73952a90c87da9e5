"""transformers integration: Llama conversion (llama.py), configs and models per architecture (configuration.py,
modeling.py), and their registration with AutoConfig and AutoModelForCausalLM.

Registration is explicit. Importing :mod:`linlm.hf.configuration` registers every architecture's config class with
AutoConfig, and importing :mod:`linlm.hf.modeling` every model class with AutoModelForCausalLM; ``import linlm.hf``
imports both when transformers is installed. ``import linlm`` imports none of them (nor transformers), so a
program that loads a linlm model directory with transformers' Auto classes imports ``linlm.hf`` first::

    import linlm.hf
    model = transformers.AutoModelForCausalLM.from_pretrained("hf-model")

An architecture added to linlm's registry later gets its classes when they are first asked for
(``CONFIG_CLASSES[arch]``, ``to_hf``), and they are registered then; :func:`register` registers every architecture
of the registry at once.
"""

from __future__ import annotations

import importlib.util

__all__ = ["register"]


def register() -> None:
    """Register every architecture of linlm's registry with AutoConfig and AutoModelForCausalLM now (imports
    transformers)."""
    from linlm.hf.configuration import CONFIG_CLASSES
    from linlm.hf.modeling import MODEL_CLASSES

    for classes in (CONFIG_CLASSES, MODEL_CLASSES):
        for _ in classes.values():  # each class is registered when it is made
            pass


if importlib.util.find_spec("transformers") is not None:
    register()
