"""The recipes of ``linlm reproduce``: one YAML file each in ``linlm/reproduce/recipes/``.

A recipe has a few keys of its own (``name``, ``description``, ``mode``, ``tradeoffs``, ``gpu``); every other key
is a section's settings, checked against that section's dataclass when the recipe loads (a key no section reads, an
unknown field, a wrong type or an impossible value is a one-line ConfigError before any work). The settings and
their defaults are listed in docs/reproduce.md (a table generated from the dataclasses and tested against them).

A recipe names the scaling ladder to run (``scaling.ladder``, a built-in ladder of :mod:`linlm.scaling.ladder`),
holds the MossNet comparison as a one-rung ladder of its own (``compare``: LLaMA, Mamba and MossNet at equal
active parameters and equal tokens, trained once per seed of ``compare.seeds``: :mod:`linlm.reproduce.seeds`),
sizes the evaluation sections (``quality``, ``zeroshot``, ``niah``, ``mqar``, ``decode``), and names the optional
studies (``aspect``, ``context``: shape studies; ``mossnet``: MossNet's own ladder). ``mode: local`` trains here;
``mode: torchrun`` writes one torchrun command per run and evaluates whatever has finished when the command is run
again.

A recipe may start from another (``base: NAME``): the base's mapping with this file's keys merged over it (mappings
key by key, anything else, lists included, replaced), so a longer variant states only what it changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linlm.errors import ConfigError, choices_text
from linlm.schema import load_yaml

RECIPE_DIR = Path(__file__).resolve().parent / "recipes"
MODES = ("local", "torchrun")
# The keys of a recipe that belong to no section; every other key is a section's (sections.recipe_keys()).
OWN_KEYS = ("name", "description", "mode", "tradeoffs", "gpu")


@dataclass
class GPU:
    """For --dry-run of torchrun recipes: the accelerator assumed for GPU-hours."""

    name: str = "A100 80GB"
    peak_flops: float = 312e12
    mfu: float = 0.4


@dataclass
class Recipe:
    """A recipe: its own keys, and each section's settings (``recipe.mqar`` is the mqar section's dataclass)."""

    name: str
    description: str
    mode: str = "local"
    # {section or key: what this recipe's size gives up there}: shown in the report beside the claims, so that a
    # verdict of "cannot tell" can be read against the power the settings left it.
    tradeoffs: dict = field(default_factory=dict)
    gpu: GPU = field(default_factory=GPU)
    settings: dict = field(default_factory=dict)  # {recipe key: its section's settings}

    def __getattr__(self, key: str) -> Any:
        settings = self.__dict__.get("settings") or {}
        if key in settings:
            return settings[key]
        raise AttributeError(f"recipe {self.__dict__.get('name')!r} has no setting {key!r}")

    @property
    def seeds(self) -> int:
        """How many times the comparison trains each architecture (``compare.seeds``)."""
        return self.settings["compare"].seeds

    def source(self) -> dict[str, Any]:
        """The recipe's mapping, its base merged in (for the report and the directory's marker)."""
        return recipe_data(self.name)

    def with_settings(self, **mappings: Any) -> "Recipe":
        """This recipe with the keys ``mappings`` replaced (each a mapping, as in a recipe file), checked as
        :func:`load_recipe` checks a file."""
        return build_recipe({**self.source(), **mappings}, f"recipe {self.name}")


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def recipe_data(name: str, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The mapping of recipe ``name``: its file, merged over its ``base`` recipe's mapping when it names one."""
    from linlm.schema import deep_merge

    path = RECIPE_DIR / f"{name}.yaml"
    if not path.is_file():
        where = f"recipe {_seen[-1]}: base" if _seen else "--recipe"
        raise ConfigError(f"{where}: unknown recipe {name!r}; valid recipes are {choices_text(recipe_names())}")
    data = load_yaml(path)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or base in (*_seen, name):
        raise ConfigError(f"{path}: base: {base!r}; name another recipe (one that does not lead back to {name})")
    return {**deep_merge(recipe_data(base, (*_seen, name)), data), "name": data.get("name", name)}


def build_recipe(data: dict[str, Any], where: str) -> Recipe:
    """A recipe from its mapping, every key checked: its own keys, and each section's settings against that
    section's dataclass. A key that no section reads is refused, naming the keys that exist."""
    from linlm.reproduce.section import load_options
    from linlm.reproduce.sections import recipe_keys
    from linlm.schema import from_dict

    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of recipe keys, got {data!r}")
    keys = recipe_keys()
    unknown = [k for k in data if k not in OWN_KEYS and k not in keys]
    if unknown:
        raise ConfigError(f"{where}: key {unknown[0]!r} is read by no section; a recipe's keys are "
                          f"{choices_text([*OWN_KEYS, *keys])}")
    for key in ("name", "description"):
        if not isinstance(data.get(key), str):
            raise ConfigError(f"{where}: {key}: give a string")
    mode = data.get("mode", "local")
    if mode not in MODES:
        raise ConfigError(f"{where}: mode: {mode!r} is not one of {choices_text(MODES)}")
    tradeoffs = data.get("tradeoffs") or {}
    named = {*keys, *(s for k in keys for s in _readers(k))}
    if not isinstance(tradeoffs, dict) or any(k not in named or not isinstance(v, str) for k, v in tradeoffs.items()):
        raise ConfigError(f"{where}: tradeoffs: give {{section: text}} for sections among {choices_text(named)}")
    try:
        gpu = from_dict(GPU, data.get("gpu") or {}, prefix="gpu.")
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    settings = {key: load_options(cls, data.get(key), f"{where}: {key}") for key, cls in keys.items()}
    return Recipe(data["name"], data["description"], mode, dict(tradeoffs), gpu, settings)


def _readers(key: str) -> list[str]:
    from linlm.reproduce.sections import readers

    return readers(key)


def load_recipe(name: str) -> Recipe:
    """The built-in recipe ``name``, every key checked (:func:`build_recipe`) before any work."""
    return build_recipe(recipe_data(name), str(RECIPE_DIR / f"{name}.yaml"))
