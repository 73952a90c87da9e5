"""What ``import linlm`` offers, and how every package exports its names (linlm.exports): one ``__all__`` each,
every name in it importable, nothing heavy imported before a name is used."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import linlm

SRC = Path(__file__).resolve().parents[1] / "src" / "linlm"
# reproduce's sections are being rewritten as typed records; their package gets its exports with them.
PACKAGES = sorted(name for name in ("linlm" + "".join(f".{p}" for p in f.parent.relative_to(SRC).parts)
                                    for f in SRC.rglob("__init__.py")) if name != "linlm.reproduce.sections")
WHAT_A_USER_CALLS = ["create_model", "load", "convert", "generate", "evaluate", "perplexity", "register", "train"]


def test_import_linlm_is_cheap_and_offers_what_a_user_calls():
    code = ("import sys, linlm; heavy = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]; "
            f"print(heavy, sorted(set({WHAT_A_USER_CALLS!r}) - set(linlm.__all__)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] []"
    for name in WHAT_A_USER_CALLS:
        assert callable(getattr(linlm, name)), name
    from linlm.eval.perplexity import perplexity
    from linlm.models.generation import generate
    from linlm.models.registry import register

    assert (linlm.generate, linlm.perplexity, linlm.register) == (generate, perplexity, register)
    assert set(WHAT_A_USER_CALLS) <= set(dir(linlm))


def test_linlm_train_is_the_package_and_trains_when_called(monkeypatch):
    import linlm.train.trainer as trainer

    from linlm import train

    assert train is linlm.train and train.Trainer is trainer.Trainer  # the package, whichever way it is reached
    assert train.train is trainer.train
    calls = []
    monkeypatch.setattr(train, "train", lambda *a, **k: calls.append((a, k)) or "trained")
    assert linlm.train("cfg", resume=True) == "trained" and calls == [(("cfg",), {"resume": True})]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_exports_with_all_and_each_name_resolves(package):
    module = importlib.import_module(package)
    assert isinstance(module.__all__, list), f"{package} has no __all__"
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        module.no_such_name


def test_a_name_that_is_also_a_module_means_the_name():
    """linlm.conversion.convert is a module and the function it defines: the package's name is the function,
    whichever was imported first."""
    import linlm.conversion
    import linlm.conversion.convert  # noqa: F401

    assert callable(linlm.conversion.convert)
    assert linlm.conversion.convert is sys.modules["linlm.conversion.convert"].convert
    # linlm.convert is the one that also takes a training run's directory (the convert command's)
    assert linlm.convert is sys.modules["linlm.conversion.cli"].convert
