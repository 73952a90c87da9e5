"""Rules the library's source keeps, checked on its syntax trees: no module reaches into another's private names,
plots leave pyplot alone, and nothing is hooked into Python's import system behind the user's back."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "linlm"
MODULES = sorted(SRC.rglob("*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(tree: ast.Module) -> list[str]:
    """``from linlm.x import _name`` and ``module._name`` where ``module`` was imported from linlm."""
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("linlm"):
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("linlm"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in modules):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def _everywhere(check) -> dict[str, list[str]]:
    return {str(p.relative_to(SRC)): found for p in MODULES if (found := check(_tree(p)))}


def test_no_module_uses_another_modules_private_names():
    assert _everywhere(private_uses) == {}


def test_the_private_name_check_finds_both_forms():
    tree = ast.parse("from linlm.layers.state import _tensors\nfrom linlm import outputs\nimport linlm.hf as h\n"
                     "outputs._write(1)\nh._run()\noutputs.write_json\n")
    assert private_uses(tree) == ["line 1: from linlm.layers.state import _tensors", "line 4: outputs._write",
                                  "line 5: h._run"]


def pyplot_uses(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        if "matplotlib.pyplot" in names or "pylab" in names:
            found.append(f"line {node.lineno}: imports pyplot")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "use"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "matplotlib"):
            found.append(f"line {node.lineno}: matplotlib.use")
    return found


def test_plots_are_figures_of_their_own():
    """No module imports pyplot or picks a backend: each plot is a matplotlib Figure written through
    linlm.outputs (save_figure, figure_png), so a program that uses linlm keeps its own backend and figures."""
    assert _everywhere(pyplot_uses) == {}


def test_the_pyplot_check_finds_imports_and_backends():
    tree = ast.parse("import matplotlib.pyplot as plt\nfrom matplotlib import pyplot\nimport matplotlib\n"
                     "matplotlib.use('Agg')\nfrom matplotlib.figure import Figure\n")
    assert pyplot_uses(tree) == ["line 1: imports pyplot", "line 2: imports pyplot", "line 4: matplotlib.use"]


def test_only_the_opt_in_lm_eval_hook_touches_the_import_system():
    """``linlm lm-eval-hook install`` is the one place a finder goes on sys.meta_path (the user asks for it);
    transformers registration is explicit (importing linlm.hf)."""
    touching = sorted(str(p.relative_to(SRC)) for p in MODULES
                      if any(isinstance(n, ast.Attribute) and n.attr == "meta_path" for n in ast.walk(_tree(p))))
    assert touching == ["eval/lm_eval_hook.py"]
