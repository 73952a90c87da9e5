"""Scaling studies: ladders and their planned runs, the sweep, fits and the report."""

from linlm.exports import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "load_ladder": "linlm.scaling.ladder", "plan_runs": "linlm.scaling.ladder",
})
