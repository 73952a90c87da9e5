"""The recipes of ``linlm reproduce``: one YAML file each in ``linlm/reproduce/recipes/``.

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

from linlm.schema import from_dict, load_yaml
from linlm.errors import ConfigError, choices_text
from linlm.reproduce.seeds import seed_count

RECIPE_DIR = Path(__file__).resolve().parent / "recipes"
MODES = ("local", "torchrun")


@dataclass
class Recipe:
    name: str
    description: str
    scaling: dict  # {ladder: NAME, archs: [...] (optional)}
    compare: dict  # a ladder mapping (linlm.scaling.ladder.ladder_from_dict), plus seeds (linlm.reproduce.seeds)
    mode: str = "local"
    fits: dict = field(default_factory=dict)  # linlm.scaling.analysis.FitOptions fields
    quality: dict = field(default_factory=dict)  # {max_tokens: N}: validation tokens scored per model
    zeroshot: dict = field(default_factory=dict)  # {tasks: [...], limit: N}
    niah: dict = field(default_factory=dict)  # NIAHConfig fields
    mqar: dict = field(default_factory=dict)  # {task, widths, experts, policies, seeds, archs, steps, ...}
    decode: dict = field(default_factory=dict)  # {contexts, decode_tokens, archs, model, per_arch, device, dtype}
    # The optional studies (linlm.reproduce.sections.shape), each {ladder: NAME or a ladder mapping, ...}; {}: not run.
    aspect: dict = field(default_factory=dict)  # an aspect-ratio study ladder; max_tokens: validation tokens scored
    context: dict = field(default_factory=dict)  # a context-length study ladder; max_tokens as for aspect
    mossnet: dict = field(default_factory=dict)  # MossNet's scaling ladder (with its baselines), fitted like scaling
    # {section: what this recipe's size gives up there}: shown in the report beside the claims, so that a verdict of
    # "tie" or "not supported at this scale" can be read against the power the settings left it.
    tradeoffs: dict = field(default_factory=dict)
    # For --dry-run of torchrun recipes: the accelerator assumed for GPU-hours.
    gpu: dict = field(default_factory=lambda: {"name": "A100 80GB", "peak_flops": 312e12, "mfu": 0.4})

    @property
    def seeds(self) -> int:
        """How many times the comparison trains each architecture (``compare.seeds``)."""
        return seed_count(self.compare, f"recipe {self.name}: compare.seeds")

    def source(self) -> dict[str, Any]:
        """The recipe's mapping, its base merged in (for the report and the directory's marker)."""
        return recipe_data(self.name)


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


def load_recipe(name: str) -> Recipe:
    path = RECIPE_DIR / f"{name}.yaml"
    data = recipe_data(name)
    try:
        recipe = from_dict(Recipe, data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    if recipe.mode not in MODES:
        raise ConfigError(f"{path}: mode: {recipe.mode!r} is not one of {choices_text(MODES)}")
    if not isinstance(recipe.scaling.get("ladder"), str):
        raise ConfigError(f"{path}: scaling.ladder: name a built-in ladder")
    seed_count(recipe.compare, f"{path}: compare.seeds")
    return recipe
