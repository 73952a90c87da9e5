"""``linlm reproduce``: both studies end to end (the scaling ladder and its laws, MossNet against its baselines,
evaluation, retrieval, decoding) in one resumable job, with a report whose claims table is computed from the run.

The package sits on top of everything else: it drives :mod:`linlm.scaling`, :mod:`linlm.eval` and
:mod:`linlm.infer`, and nothing imports it but the CLI.
"""

from linlm.reproduce.job import run
from linlm.reproduce.recipes import load_recipe, recipe_names

# The earlier names of the two functions (a recipe was called a preset), kept for user code.
load_preset, preset_names = load_recipe, recipe_names

__all__ = ["run", "load_recipe", "recipe_names", "load_preset", "preset_names"]
