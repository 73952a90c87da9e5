"""Architectures from outside linlm: modules that call ``linlm.register`` when imported.

The ``linlm`` command loads them before it parses anything else, so ``--arch NAME`` and ``model.arch=NAME`` reach a
plugin's architecture, in torchrun's workers too (they inherit the environment). Two ways to name one:

- ``LINLM_PLUGINS=my_arch,other.module``: modules on the Python path, imported in that order;
- an entry point in the group ``linlm.architectures`` of an installed package, whose value is a module (imported) or
  ``module:ATTRIBUTE`` holding an ArchSpec (registered).

A plugin that cannot be imported, or whose registration is refused (a taken name, a mixer that breaks the token-mixer
contract), stops the command with one line naming it (exit 2) before any work. Nothing here imports torch unless a
plugin is named.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from typing import Any, Callable

from linlm.errors import ConfigError, LinlmError

PLUGINS_ENV = "LINLM_PLUGINS"
PLUGIN_GROUP = "linlm.architectures"
_LOADED: set[str] = set()  # the plugins loaded in this process, each once


def load_plugins() -> None:
    """Import every plugin named by $LINLM_PLUGINS, then those of the ``linlm.architectures`` entry points."""
    for name in (n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",")):
        if name:
            _load(name, f"{PLUGINS_ENV}: {name}", lambda n=name: importlib.import_module(n))
    for point in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        _load(point.value, f"entry point {point.name} ({point.value})", point.load)


def _load(key: str, where: str, load: Callable[[], Any]) -> None:
    if key in _LOADED:
        return
    try:
        found = load()
        if not isinstance(found, type(importlib)):  # module:ATTRIBUTE: an ArchSpec to register
            from linlm.models.registry import register

            register(found)
    except LinlmError as e:
        raise ConfigError(f"{where}: {e}") from None
    except Exception as e:  # the plugin's own import failed: which one, and why, in one line
        why = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError(f"{where}: cannot be imported ({type(e).__name__}: {why}); check the module's name and "
                          "that it is on the Python path") from None
    _LOADED.add(key)
