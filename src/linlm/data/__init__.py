"""Data: sources (built-in corpus, local files, HF datasets), tokenizers, tokenised shards, a resumable loader.

Names are imported lazily, so that ``import linlm.data`` stays cheap (the loader needs torch; prepare does not).
The ``prepare`` function is not re-exported here, because it would shadow its own module ``linlm.data.prepare``:
use ``from linlm.data.prepare import prepare``.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "builtin_corpus_path": "corpus", "builtin_corpus_files": "corpus", "load_builtin_corpus": "corpus",
    "cache_dir": "corpus", "SHAKESPEARE": "corpus", "CorpusSpec": "corpus",
    "iter_texts": "sources", "open_source": "sources", "Source": "sources", "SourceStats": "sources",
    "Tokenizer": "tokenizer", "EOS_TOKEN": "tokenizer",
    "TokenDataset": "loader", "Batches": "loader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"linlm.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'linlm.data' has no attribute {name!r}")
