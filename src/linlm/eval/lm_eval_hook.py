"""Make lm-evaluation-harness' own ``lm_eval`` command see the model ``linlm``: an opt-in start-up hook.

lm-eval (0.4.x) looks ``--model`` up in its in-process registry, which it fills from its own ``MODEL_MAPPING``
when ``lm_eval.models`` is first imported; it reads no entry points, so no installed package can add a model to
the ``lm_eval`` command. ``linlm lm-eval-hook install`` writes one ``.pth`` file into the environment's
site-packages. Python runs its one line at start-up: if this file still exists, it is loaded on its own (not as
part of the linlm package, so neither linlm nor torch is imported) and puts a finder on ``sys.meta_path`` that
waits for ``lm_eval.models``. When a process imports that module, the finder lets it run and then registers
``linlm`` in lm-eval's registry as a lazy placeholder (``linlm.eval.harness:LinlmLM``): linlm itself is imported
only when the model ``linlm`` is asked for. Processes that never import lm-eval pay for one small file read.

``linlm lm-eval-hook remove`` deletes the ``.pth`` file (only one that linlm wrote); ``status`` says where it is.
If linlm is uninstalled first, the line finds no file and does nothing.

Apart from install/remove (which the CLI calls, and which import linlm's errors), this module uses the standard
library only: the ``.pth`` line runs it at start-up, by file path.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

PTH_NAME = "linlm-lm-eval-hook.pth"
MARKER = "# written by `linlm lm-eval-hook install`: lets `lm_eval --model linlm` find linlm's model"
TARGET_MODULE = "lm_eval.models"
MODEL_NAME = "linlm"
MODEL_PATH = "linlm.eval.harness:LinlmLM"


def register(registry) -> None:
    """Add ``linlm`` to an lm-eval model registry as a lazy placeholder, unless it is there already."""
    if MODEL_NAME not in registry:
        registry.register(MODEL_NAME, target=MODEL_PATH)


class _RegisteringLoader(importlib.abc.Loader):
    """Runs the real loader of ``lm_eval.models``, then registers linlm's model."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        from lm_eval.api.registry import model_registry

        register(model_registry)


class LmEvalFinder(importlib.abc.MetaPathFinder):
    """A meta-path finder that only answers for ``lm_eval.models`` (see the module doc)."""

    linlm_lm_eval_hook = True  # how a second copy of this module recognises an installed finder

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _RegisteringLoader(spec.loader)
        return spec


def install_finder() -> None:
    """Put the finder first on sys.meta_path (once per process); if lm-eval's models are already imported,
    register linlm's model now."""
    if not any(getattr(f, "linlm_lm_eval_hook", False) for f in sys.meta_path):
        sys.meta_path.insert(0, LmEvalFinder())
    if TARGET_MODULE in sys.modules:
        from lm_eval.api.registry import model_registry

        register(model_registry)


def pth_text(hook_file: str) -> str:
    """The ``.pth`` file: a marker line, then one import line that loads ``hook_file`` if it still exists."""
    line = ("import os, importlib.util as u; p = {path!r}; s = os.path.isfile(p) and "
            "u.spec_from_file_location('_linlm_lm_eval_hook', p); m = s and u.module_from_spec(s); "
            "s and s.loader.exec_module(m); m and m.install_finder()").format(path=hook_file)
    return f"{MARKER}\n{line}\n"


def site_dir() -> str:
    """The running environment's site-packages (sysconfig's purelib)."""
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def pth_path(directory: str | None = None) -> str:
    return os.path.join(directory or site_dir(), PTH_NAME)


def _ours(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().rstrip("\n") == MARKER
    except (OSError, UnicodeDecodeError):
        return False


def install(directory: str | None = None) -> str:
    """Write the ``.pth`` file (atomically; replacing only a file of linlm's own). Returns its path."""
    from linlm.errors import StorageError

    path = pth_path(directory)
    if os.path.lexists(path) and not _ours(path):
        raise StorageError(f"{path} exists and was not written by linlm; move it away, then install again")
    hook_file = os.path.abspath(__file__)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(pth_text(hook_file))
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise StorageError(f"cannot write {path}: {e.strerror or e}; run with write access to that "
                            "site-packages (the environment lm_eval runs in)") from e
    return path


def remove(directory: str | None = None) -> str | None:
    """Delete the ``.pth`` file if linlm wrote it. Returns its path, or None when there was none."""
    from linlm.errors import StorageError

    path = pth_path(directory)
    if not os.path.lexists(path):
        return None
    if not _ours(path):
        raise StorageError(f"{path} was not written by linlm; it is left as it is")
    try:
        os.unlink(path)
    except OSError as e:
        raise StorageError(f"cannot remove {path}: {e.strerror or e}") from e
    return path


def installed(directory: str | None = None) -> bool:
    path = pth_path(directory)
    return os.path.isfile(path) and _ours(path)
