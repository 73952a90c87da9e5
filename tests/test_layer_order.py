"""The layer order of docs/code-layout.md is the source: every module of src/linlm belongs to a row of its table,
and no module imports a module of a row below it (further down the table is higher up the layers).

Imports are read from the syntax trees, lazy ones included: ``import`` and ``from ... import`` anywhere in a module
(inside functions too), and module paths written as strings for ``importlib.import_module`` (a string that is a
whole module path, ``"linlm.infer.cli"``, or an f-string that starts with one, ``f"linlm.train.{name}"``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "linlm"
DOC = ROOT / "docs" / "code-layout.md"
MODULE_PATH = re.compile(r"linlm(\.\w+)+")


def read_table(text: str) -> list[tuple[str, list[str]]]:
    """[(layer, [entries of its package cell])] in the order of the table under "# How the code is laid out"."""
    rows, started = [], False
    for line in text.splitlines():
        if line.startswith("| layer |"):
            started = True
            continue
        if started and line.startswith("| ---"):
            continue
        if started and not line.startswith("|"):
            break
        if started:
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return rows


def modules_of(src: Path) -> dict[str, Path]:
    """{dotted module name: file} of a package tree (a package's __init__.py is the package's own name)."""
    out = {}
    for f in sorted(src.rglob("*.py")):
        parts = list(f.relative_to(src.parent).with_suffix("").parts)
        out[".".join(parts)] = f
    return out


def _matches(entry: str, module: str) -> int:
    """How specifically ``entry`` of the table names ``module`` (0: not at all). ``x.py`` a top-level module,
    ``x/`` a package, ``*/cli.py`` the cli module of any package."""
    rel = module.split(".")[1:]
    if entry.startswith("*/"):
        return 3 if len(rel) == 2 and rel[1] == entry[2:].removesuffix(".py") else 0
    if entry.endswith("/"):
        return 2 if rel and rel[0] == entry[:-1] else 0
    return 3 if rel == [entry.removesuffix(".py")] else 0


def layer_of(module: str, table: list[tuple[str, list[str]]]) -> int | None:
    """The row index of ``module`` (``linlm.models.lm``), by its most specific entry; None when no row names it."""
    best, where = 0, None
    for i, (_, entries) in enumerate(table):
        for entry in entries:
            score = _matches(entry, module)
            if score > best:
                best, where = score, i
    return where


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def imports_of(module: str, source: str, is_package: bool, modules: set[str]) -> set[str]:
    """The linlm modules ``source`` imports, lazily or not. ``from P import n`` imports module P.n when there is
    one, else P; a string counts only when it names a module of ``modules`` exactly (``"linlm.architectures"``, an
    entry-point group, is no module)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(resolve(a.name, modules) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                up = parts[: len(parts) - node.level + (1 if is_package else 0)]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else resolve(base, modules))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if "." in node.value and node.value in modules:  # "linlm" alone is a name (the logger, the prog)
                found.add(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            head = str(node.values[0].value)
            if head.endswith(".") and head[:-1] in modules:
                found.add(head[:-1])
    return {name for name in found if name and name.split(".")[0] == "linlm"}


def resolve(name: str, modules) -> str | None:
    """The module ``name`` lives in (``linlm.models.lm.CausalLM`` -> ``linlm.models.lm``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def check(table, modules: dict[str, str]) -> tuple[list[str], list[str]]:
    """(modules no row names, imports up the table as "a (layer) imports b (layer)") of {module: source}."""
    names = {m.removesuffix(".__init__"): m for m in modules}
    where = {m: layer_of(m, table) for m in names}
    # The package __init__ of linlm itself is a module like the others (named by "__init__.py" in the table).
    where["linlm"] = layer_of("linlm.__init__", table)
    missing = sorted(m for m, w in where.items() if w is None)
    up = []
    for short, full in names.items():
        mine = where[short]
        for target in sorted(imports_of(short, modules[full], full.endswith("__init__"), set(names))):
            if target == short or mine is None or where[target] is None:
                continue
            if where[target] > mine:
                up.append(f"{short} ({table[mine][0]}) imports {target} ({table[where[target]][0]})")
    return missing, sorted(set(up))


def test_every_module_is_in_the_table_and_no_import_goes_up():
    table = read_table(DOC.read_text(encoding="utf-8"))
    assert len(table) >= 10
    sources = {m: f.read_text(encoding="utf-8") for m, f in modules_of(SRC).items()}
    missing, up = check(table, sources)
    assert missing == [], f"modules no row of {DOC.name}'s table names: {missing}"
    assert up == [], "imports up the layers:\n" + "\n".join(up)


TABLE = """# How the code is laid out
| layer | package | what it holds |
| --- | --- | --- |
| base | `errors.py` | errors |
| models | `models/` | models |
| infer | `infer/` | generation |
| hf | `hf/` | transformers |
| commands | `cli.py`, `*/cli.py` | commands |

## Next
"""


def test_the_check_finds_an_import_up_a_lazy_one_and_a_module_missing():
    table = read_table(TABLE)
    assert [name for name, _ in table] == ["base", "models", "infer", "hf", "commands"]
    sources = {
        "linlm.errors": "",
        "linlm.models.lm": "from linlm.errors import X\nfrom linlm import errors\n",
        "linlm.infer.generate": "def f():\n    from linlm.hf.modeling import M\n",  # lazy, up
        "linlm.infer.cli": "import importlib\nimportlib.import_module('linlm.hf.modeling')\n",  # commands: fine
        "linlm.infer.export": "import importlib\ndef g(n):\n    return importlib.import_module(f'linlm.hf.{n}')\n",
        "linlm.hf.__init__": "",
        "linlm.hf.modeling": '"""Uses linlm.infer, in prose only."""\nfrom ..models import lm\n',
        "linlm.models.registry": "NAMES = ('linlm.infer.generate',)\nGROUP = 'linlm.architectures'\nLOG = 'linlm'\n",
        "linlm.scaling.plan": "",
        "linlm.__init__": "",
    }
    missing, up = check(table, sources)
    assert missing == ["linlm", "linlm.scaling.plan"]
    assert up == ["linlm.infer.export (infer) imports linlm.hf (hf)",
                  "linlm.infer.generate (infer) imports linlm.hf.modeling (hf)",
                  "linlm.models.registry (models) imports linlm.infer.generate (infer)"]
