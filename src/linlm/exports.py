"""How every linlm package exports its names: one ``__all__``, each name imported when first used.

A package's ``__init__.py`` says::

    __all__, __getattr__, __dir__ = exports(__name__, {"Trainer": "linlm.train.trainer", ...})

A value is ``"module"`` (the module's attribute of the same name), ``"module:attribute"`` or ``"module:"`` (the
module itself). Nothing is imported until a name is used, so ``import linlm`` and ``import linlm.train`` stay cheap
(no torch). Two exceptions, both to keep the names meaning what they say:

- A name that is also a submodule of the package (``linlm.conversion.convert``, function and module) is imported at
  once: otherwise whichever imported the submodule first would decide what the name is.
- Any submodule is an attribute too (``import linlm`` then ``linlm.models.lm``), as it was when packages imported
  their modules eagerly.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any, Callable, Mapping


def _load(spec: str, name: str) -> Any:
    target, colon, attribute = spec.partition(":")
    module = importlib.import_module(target)
    if colon and not attribute:
        return module
    return getattr(module, attribute or name)


def exports(package: str, names: Mapping[str, str]) -> tuple[list[str], Callable[[str], Any], Callable[[], list]]:
    """(``__all__``, ``__getattr__``, ``__dir__``) for ``package``, whose public names are ``names``."""
    namespace = vars(sys.modules[package])
    for name, spec in names.items():
        if importlib.util.find_spec(f"{package}.{name}") is not None:  # a submodule of that name too: now
            namespace[name] = _load(spec, name)

    def __getattr__(name: str) -> Any:
        if name in names:
            value = namespace[name] = _load(names[name], name)
            return value
        if not name.startswith("__"):
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list:
        return sorted({*namespace, *names})

    return sorted(names), __getattr__, __dir__
