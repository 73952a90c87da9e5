"""Evaluation: zero-shot tasks (``evaluate``), perplexity (perplexity.py), needle in a haystack, MQAR, the
lm-evaluation-harness adapter."""

from linlm.exports import exports

__all__, __getattr__, __dir__ = exports(__name__, {"evaluate": "linlm.eval.evaluator"})
