"""CLI-level commands that use several subsystems at once (``linlm demo``, ``linlm check``).

They sit above train, infer and models, so nothing below ever imports them.
"""

from linlm.exports import exports

__all__, __getattr__, __dir__ = exports(__name__, {})
