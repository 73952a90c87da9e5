"""Experiments that train a grid of models on one task and measure each: MQAR (``linlm mqar``).

This layer sits above :mod:`linlm.train` and :mod:`linlm.eval` (the task, its data and its accuracy live there) and
below :mod:`linlm.reproduce`, which runs the experiments as sections of its job.
"""

from linlm.exports import exports

__all__, __getattr__, __dir__ = exports(__name__, {"run_experiment": "linlm.experiments.mqar"})
