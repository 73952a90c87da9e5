"""transformers integration: Llama conversion (llama.py), configs and models per architecture (configuration.py,
modeling.py), and their registration with AutoConfig and AutoModelForCausalLM.

Registration costs nothing at ``import linlm``: transformers is not imported. Each of transformers' two auto
modules (configuration_auto, modeling_auto) that is already loaded gets linlm's classes at once; the others get
them from an import hook right after they load. Without transformers installed nothing happens.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_CONFIG_AUTO = "transformers.models.auto.configuration_auto"
_MODEL_AUTO = "transformers.models.auto.modeling_auto"
_done: set[str] = set()


def _register_configs() -> None:
    # From their own modules: this may run while transformers' package __init__ is still being imported.
    from transformers.models.auto.configuration_auto import AutoConfig

    from linlm.hf.configuration import CONFIG_CLASSES

    for cfg_cls in CONFIG_CLASSES.values():
        AutoConfig.register(cfg_cls.model_type, cfg_cls, exist_ok=True)


def _register_models() -> None:
    from transformers.models.auto.modeling_auto import AutoModelForCausalLM

    from linlm.hf.modeling import MODEL_CLASSES

    for model_cls in MODEL_CLASSES.values():
        AutoModelForCausalLM.register(model_cls.config_class, model_cls, exist_ok=True)


_STEPS = {_CONFIG_AUTO: _register_configs, _MODEL_AUTO: _register_models}


def _run(name: str) -> None:
    if name in _done:
        return
    _done.add(name)
    try:
        _STEPS[name]()
    except Exception:  # noqa: BLE001 - a transformers that does not fit must never break the import that ran this
        pass


def register() -> None:
    """Register every linlm architecture with AutoConfig and AutoModelForCausalLM now (imports transformers)."""
    import transformers.models.auto.configuration_auto  # noqa: F401
    import transformers.models.auto.modeling_auto  # noqa: F401

    for name in _STEPS:
        _done.discard(name)
        _STEPS[name]()
        _done.add(name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Registers linlm's classes right after a transformers auto module has run to the end."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _STEPS or fullname in _done:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            _run(fullname)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Called by ``import linlm``: register with the auto modules already loaded, and hook the others."""
    for name in _STEPS:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__spec__", None) is not None and not _is_initializing(module):
            _run(name)
    if not _done.issuperset(_STEPS) and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def _is_initializing(module) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))
