"""Data: sources (built-in corpus, local files, HF datasets), tokenizers, tokenised shards, a resumable loader.

Names are imported when first used (linlm.exports), so that ``import linlm.data`` stays cheap (the loader needs
torch; prepare does not). The ``prepare`` function is not exported here, because its module has its name: use
``from linlm.data.prepare import prepare``.
"""

from __future__ import annotations

from linlm.exports import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "builtin_corpus_path": "linlm.data.corpus", "builtin_corpus_files": "linlm.data.corpus",
    "load_builtin_corpus": "linlm.data.corpus", "cache_dir": "linlm.data.corpus", "SHAKESPEARE": "linlm.data.corpus",
    "CorpusSpec": "linlm.data.corpus",
    "iter_texts": "linlm.data.sources", "open_source": "linlm.data.sources", "Source": "linlm.data.sources",
    "SourceStats": "linlm.data.sources",
    "Tokenizer": "linlm.data.tokenizer", "EOS_TOKEN": "linlm.data.tokenizer",
    "TokenDataset": "linlm.data.loader", "Batches": "linlm.data.loader",
})
