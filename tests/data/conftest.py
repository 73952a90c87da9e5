"""Shared fixtures for the data tests: a small synthetic corpus and a tiny BPE trained on it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

WORDS = ("the quick brown fox jumps over lazy dog thou art more lovely and temperate rough winds do shake "
         "darling buds of may summer's lease hath all too short a date naïve café Zoë 東京 データ 🎉 👍🏽 ∑x² —").split()


def make_docs(n: int, seed: int = 0, min_words: int = 20, max_words: int = 400) -> list[str]:
    """Documents of random words with varied whitespace: spaces, tabs, newlines, blank lines, trailing spaces."""
    rng = random.Random(seed)
    seps = [" "] * 12 + ["\n"] * 3 + ["\n\n", "\t", "  ", " \n"]
    docs = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))]
        docs.append("".join(w + rng.choice(seps) for w in words))
    return docs


@pytest.fixture(scope="session")
def docs() -> list[str]:
    return make_docs(60)


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory, docs) -> Path:
    """One document per .txt file, named so that sorted order is document order."""
    root = tmp_path_factory.mktemp("corpus")
    for i, doc in enumerate(docs):
        (root / f"doc{i:03d}.txt").write_text(doc, encoding="utf-8", newline="")
    return root


@pytest.fixture(scope="session")
def tiny_tokenizer(docs):
    from linlm.data.tokenizer import Tokenizer

    return Tokenizer.train(docs, 300)
