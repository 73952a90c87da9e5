"""Perplexity of a model on any text source (``linlm.data.sources``: files, globs, directories, JSON Lines,
Parquet, ``shakespeare``, ``hf:NAME[:CONFIG][@SPLIT]``), per token and per byte.

Each document is scored on its own: its tokens follow the tokenizer's prefix token (``prefix_id``: the end-of-text
id, the boundary a model trained on packed documents has seen before every document; the BOS for a pretrained
tokenizer that has one), and every token of the document is predicted (the closing end-of-text is not). With N
the scored tokens, B the document's UTF-8 bytes and W its whitespace-separated words, all summed over documents,
and NLL the summed negative log-likelihood in nats:

    token perplexity = exp(NLL / N)       bits per byte = NLL / (B ln 2)       word perplexity = exp(NLL / W)

Bits per byte does not depend on the tokenizer, so models with different tokenizers can be compared with it.

Long documents, two modes:

- ``stateful``: the document runs in chunks of ``chunk`` tokens, each continuing from the state of the previous
  one, so every token sees the whole document before it (exact, with constant memory for the linear models;
  LLaMA's KV cache grows and stops at its max_seq_len).
- ``sliding``: windows of ``window`` tokens that advance by ``stride``; each window scores only the tokens no
  earlier window scored, so every token after the first window sees at least ``window - stride`` tokens of
  context. ``stride == window`` gives disjoint windows (lm-evaluation-harness' rolling log-likelihood).

``auto`` (the default) is stateful for models without a position limit and sliding (window = max_seq_len) for
LLaMA. Documents are batched (right-padded; padding comes after the real tokens, so it changes nothing).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Optional

import torch

from linlm.errors import ConfigError, ShapeError
from linlm.eval.scoring import model_max_length

IGNORE = -100
MODES = ("auto", "stateful", "sliding")


@dataclass
class PerplexityResult:
    mode: str
    window: Optional[int]
    stride: Optional[int]
    chunk: Optional[int]
    documents: int = 0
    tokens: int = 0
    bytes: int = 0
    words: int = 0
    nll: float = 0.0  # summed, nats

    @property
    def nll_per_token(self) -> float:
        return self.nll / self.tokens if self.tokens else math.nan

    @property
    def token_perplexity(self) -> float:
        return math.exp(self.nll_per_token) if self.tokens else math.nan

    @property
    def bits_per_byte(self) -> float:
        return self.nll / (self.bytes * math.log(2)) if self.bytes else math.nan

    @property
    def word_perplexity(self) -> float:
        return math.exp(self.nll / self.words) if self.words else math.nan

    def to_dict(self) -> dict:
        return {**asdict(self), "nll_per_token": self.nll_per_token, "token_perplexity": self.token_perplexity,
                "bits_per_byte": self.bits_per_byte, "word_perplexity": self.word_perplexity}


def sliding_windows(n: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """For a sequence of n tokens (position 0 is the end-of-text prefix, never a target): (start, end, first) per
    window, meaning inputs seq[start:end] predict targets seq[start+1:end+1] of which those at positions >= first are
    scored. Every position 1..n-1 is scored exactly once."""
    if window < 1 or not 1 <= stride <= window:
        raise ConfigError(f"sliding window: need window >= 1 and 1 <= stride <= window, got window={window}, "
                          f"stride={stride}")
    out, a = [], 1
    b = min(1 + window, n)
    while a < n:
        start = max(0, b - 1 - window)
        out.append((start, b - 1, a))
        a, b = b, min(b + stride, n)
    return out


def _forward_nll(model, ids: torch.Tensor, targets: torch.Tensor, state=None):
    """Summed NLL over the non-ignored targets (the fused head + cross-entropy; no [B, T, V] logits) and the state."""
    n = int((targets != IGNORE).sum())
    out = model(ids, targets=targets, state=state, return_state=True)
    return (float(out.loss) * n if n else 0.0), out.state


def _pad(rows: list[list[int]], value: int, device) -> torch.Tensor:
    T = max(len(r) for r in rows)
    t = torch.full((len(rows), T), value, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        t[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return t


def _score_stateful(model, seqs: list[list[int]], chunk: int) -> float:
    inputs = _pad([s[:-1] for s in seqs], 0, model.device)
    targets = _pad([s[1:] for s in seqs], IGNORE, model.device)
    total, state = 0.0, None
    for c in range(0, inputs.shape[1], chunk):
        nll, state = _forward_nll(model, inputs[:, c:c + chunk], targets[:, c:c + chunk], state)
        total += nll
    return total


def _score_windows(model, pieces: list[tuple[list[int], int]]) -> float:
    """pieces: (tokens, k) = a window's tokens (inputs are tokens[:-1]) and the number of leading targets to skip."""
    inputs = _pad([p[:-1] for p, _ in pieces], 0, model.device)
    rows = [[IGNORE] * k + p[1 + k:] for p, k in pieces]
    targets = _pad(rows, IGNORE, model.device)
    return _forward_nll(model, inputs, targets)[0]


@torch.no_grad()
def perplexity(model, tokenizer, texts: Iterable[str], *, mode: str = "auto", window: Optional[int] = None,
               stride: Optional[int] = None, chunk: int = 2048, batch_size: int = 4, max_docs: Optional[int] = None,
               max_tokens: Optional[int] = None, progress: Optional[Callable[[int], None]] = None,
               encode: Optional[Callable[[str], list[int]]] = None) -> PerplexityResult:
    """Score the documents of ``texts`` (strings, e.g. ``linlm.data.sources.iter_texts(spec)``).

    ``max_docs`` stops after that many documents; ``max_tokens`` scores that many tokens in total, the last
    document cut where they run out. ``window`` and ``stride`` of the sliding mode default (None) to the model's max_seq_len (else 2048)
    and to half the window. Every count given must be >= 1: a 0 is refused, never read as "the default".
    ``progress(tokens)`` is called after each batch. ``encode`` gives the scored ids of a text (default
    ``tokenizer.encode``; the lm-eval adapter passes ``tokenizer.encode_input``, as lm-eval's HF wrapper scores a
    tokenizer's BOS after the prefix too).
    """
    if mode not in MODES:
        raise ConfigError(f"mode: unknown perplexity mode {mode!r}; valid choices are {', '.join(MODES)}")
    for name, value in (("window", window), ("stride", stride), ("chunk", chunk), ("batch_size", batch_size),
                        ("max_docs", max_docs), ("max_tokens", max_tokens)):
        if value is not None and value < 1:  # None takes the default; 0 is a value, and an impossible one
            raise ConfigError(f"{name}: must be >= 1, got {value}")
    limit = model_max_length(model)
    if mode == "auto":
        mode = "sliding" if limit is not None else "stateful"
    if mode == "sliding":
        window = window if window is not None else limit or 2048
        stride = stride if stride is not None else max(1, window // 2)
        if limit is not None and window > limit:
            raise ConfigError(f"window={window} is longer than this {model.config.arch} model's max_seq_len={limit}; "
                              f"use --window {limit} or less")
        sliding_windows(2, window, stride)  # validates window and stride
    res = PerplexityResult(mode, window if mode == "sliding" else None, stride if mode == "sliding" else None,
                           chunk if mode == "stateful" else None)
    was_training = model.training
    model.eval()
    pending: list[list[int]] = []

    def flush():
        if not pending:
            return
        if mode == "stateful":
            longest = max(len(s) for s in pending) - 1
            if limit is not None and longest > limit:
                raise ShapeError(f"a document of {longest} tokens is longer than this {model.config.arch} model's "
                                 f"max_seq_len={limit}; use the sliding mode (--mode sliding)")
            res.nll += _score_stateful(model, pending, chunk)
        else:
            pieces = [(s[a:b + 1], first - a - 1) for s in pending for a, b, first in sliding_windows(len(s), window,
                                                                                                     stride)]
            for i in range(0, len(pieces), batch_size):
                res.nll += _score_windows(model, pieces[i:i + batch_size])
        n = sum(len(s) - 1 for s in pending)
        if progress is not None:
            progress(n)
        pending.clear()

    try:
        for text in texts:
            if max_docs is not None and res.documents >= max_docs:
                break
            if max_tokens is not None and res.tokens >= max_tokens:
                break
            ids = (encode or tokenizer.encode)(text)
            if not ids:
                continue
            if max_tokens is not None and res.tokens + len(ids) > max_tokens:
                # The total is the limit: the last document is cut to the tokens left, and its bytes and words
                # are those of the text those tokens decode to (bits per byte stays a per-byte figure).
                ids = ids[:max_tokens - res.tokens]
                text = tokenizer.decode(ids)
            res.documents += 1
            res.tokens += len(ids)
            res.bytes += len(text.encode("utf-8"))
            res.words += len(text.split())
            pending.append([tokenizer.prefix_id] + ids)
            if len(pending) >= batch_size:
                flush()
        flush()
    finally:
        model.train(was_training)
    if not res.documents:
        raise ShapeError("perplexity: the source yielded no document with any token")
    return res


def document_logliks(model, tokenizer, texts: Iterable[str], max_length: Optional[int] = None) -> list[float]:
    """The summed log-likelihood of each whole text (lm-evaluation-harness' ``loglikelihood_rolling``), after the
    prefix token, a BOS the tokenizer adds scored too (as lm-eval's HF wrapper scores it): stateful (exact, the
    whole document through the recurrent state) when ``max_length`` is None, else disjoint windows of
    ``max_length`` tokens (lm-eval's rolling windows). A text with no token scores 0. The lm-eval adapter and
    ``linlm perplexity --source wikitext2`` both score through this, so the two give the same numbers."""
    out = []
    for text in texts:
        if max_length is None:
            res = perplexity(model, tokenizer, [text], mode="stateful", encode=tokenizer.encode_input) \
                if text else None
        else:
            res = perplexity(model, tokenizer, [text], mode="sliding", window=max_length, stride=max_length,
                             encode=tokenizer.encode_input) if text else None
        out.append(-res.nll if res is not None else 0.0)
    return out
