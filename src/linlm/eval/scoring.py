"""Log-likelihood of continuations given contexts: the scoring core of every zero-shot task.

A *request* is one context and the continuations to score after it (the choices of a multiple-choice item, or a
single continuation). For a continuation ``c`` after context ``x`` the score is

    loglik(c | x) = sum_j log p(c_j | x, c_<j)        (natural log, summed over the continuation's tokens)

together with ``is_greedy``: whether every c_j is the argmax of its predictive distribution, i.e. whether greedy
decoding from ``x`` would produce exactly ``c`` (LAMBADA's accuracy).

Shared-context scoring (the default) runs each context once and reuses its recurrent state (or LLaMA's KV cache)
for every continuation:

1. Requests are sorted by context length (longest first, as lm-evaluation-harness does) and batched
   ``batch_size`` at a time: requests with one exact context length fill batches of their own, and the remainders
   are pooled into batches of neighbouring lengths (:func:`length_batches`).
2. The first P tokens of every context in the batch (P = the batch's shortest context) are prefilled together in
   one [B, P] forward with ``return_state=True``; no padding, so the state is exact for every architecture.
3. The state is gathered to one row per (request, continuation). Each row runs the rest of its context (the few
   tokens past P) and its continuation in one right-padded forward from that state. Right padding only follows the
   real tokens, so it cannot change them (the models are causal). The rows run longest first, at most
   2 * batch_size to a forward, so rows of similar length share a forward and pad little.
4. The head runs only at the positions whose log-likelihood is read (``logits_at``, ``apply_head=False``): with a
   vocabulary of 8192 and d_model 256 it costs 2/3 of the four layers per position. ``ops.fused.target_logprobs``
   applies it a block of vocabulary columns at a time, for all scored positions, with a running log-sum-exp per
   position: each head weight row is read once and the [n, V] logits of a forward never exist at once (the naive
   way's full-pass logits go through the same function a block of rows at a time). The target is greedy when its
   logit reaches the maximum (a max is several times cheaper than an argmax over the vocabulary on CPU; an exact
   tie with another token, which an argmax breaks by index, counts as greedy).

Cost per item with n choices: P + n (r + m) token positions against n (P + r + m) for scoring each choice on its
own (r: context tokens past P, m: continuation length), and the head at n m positions against n (P + r + m).
``shared=False`` is that naive per-choice scoring (one right-padded full pass per choice, no state, the head at
every position as a plain full pass computes it; rows grouped the same way), kept as the reference and as the
benchmark's baseline.

Contexts too long for the model are truncated from the left, as lm-evaluation-harness does: a request keeps the
last ``max_length + 1 - len(longest continuation)`` context tokens, so every choice of an item sees the same context.
The number of truncated requests is reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from linlm.errors import ShapeError
from linlm.ops.fused import target_logprobs

PAD_ID = 0  # right padding: any valid id, never read back
ROWS_PER_ITEM = 2  # a continuation forward holds at most ROWS_PER_ITEM * batch_size rows


@dataclass
class Request:
    """One context (token ids, at least one) and the continuations to score after it."""

    context: list[int]
    continuations: list[list[int]]


@dataclass
class Scored:
    """Per request: one log-likelihood and one is_greedy per continuation, plus how many context tokens were cut."""

    logliks: list[float]
    greedy: list[bool]
    truncated: int = 0


@dataclass
class ScoreStats:
    requests: int = 0
    truncated_requests: int = 0
    forward_tokens: int = 0  # token positions run through the model (the work done)
    details: list[str] = field(default_factory=list)


def config_max_length(cfg) -> Optional[int]:
    """The longest input a model of this config takes: max_seq_len for position-limited models (LLaMA), else no
    limit."""
    from linlm.models.registry import get_arch

    return cfg.max_seq_len if get_arch(cfg.arch).position_limit else None


def model_max_length(model) -> Optional[int]:
    """:func:`config_max_length` of the model's config."""
    return config_max_length(model.config)


def truncate(request: Request, max_length: Optional[int]) -> tuple[Request, int]:
    """Cut the context from the left so that context + longest continuation - 1 <= max_length tokens."""
    if not request.context:
        raise ShapeError("a request needs at least one context token; start empty contexts with the end-of-text id")
    if any(not c for c in request.continuations):
        raise ShapeError("a continuation encoded to no tokens; every choice must hold some text")
    if max_length is None:
        return request, 0
    longest = max(len(c) for c in request.continuations)
    room = max_length + 1 - longest
    if room < 1:
        raise ShapeError(f"a continuation of {longest} tokens does not fit the model's max length {max_length}; "
                         "shorten it or evaluate with a model that takes longer inputs")
    cut = max(0, len(request.context) - room)
    if not cut:
        return request, 0
    return Request(request.context[cut:], request.continuations), cut


def length_batches(order: list[int], lengths: list[int], batch_size: int) -> list[list[int]]:
    """Batches of at most ``batch_size`` requests from ``order`` (sorted by context length, longest first): requests
    of one exact context length fill batches of their own (nothing to run past the shared prefill); the remainders
    of each length are pooled, in order, into mixed batches of neighbouring lengths."""
    batches, pool = [], []
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and lengths[order[j]] == lengths[order[i]]:
            j += 1
        same = order[i:j]
        full = len(same) // batch_size * batch_size
        batches.extend(same[k:k + batch_size] for k in range(0, full, batch_size))
        pool.extend(same[full:])
        if len(pool) >= batch_size:
            batches.append(pool[:batch_size])
            pool = pool[batch_size:]
        i = j
    if pool:
        batches.append(pool)
    return batches


@torch.no_grad()
def score_requests(model, requests: Sequence[Request], *, batch_size: int = 16, shared: bool = True,
                   max_length: Optional[int] = -1, stats: Optional[ScoreStats] = None,
                   progress: Optional[Callable[[int], None]] = None) -> list[Scored]:
    """Score every continuation of every request; results come back in the order of ``requests``.

    ``max_length=-1`` takes the model's own limit (:func:`model_max_length`); None means no limit.
    ``progress(n)`` is called after each batch with the number of requests it held.
    """
    if batch_size < 1:
        raise ShapeError(f"batch_size must be >= 1, got {batch_size}")
    if max_length == -1:
        max_length = model_max_length(model)
    stats = stats if stats is not None else ScoreStats()
    prepared = []
    for r in requests:
        req, cut = truncate(r, max_length)
        prepared.append((req, cut))
        if cut:
            stats.truncated_requests += 1
    stats.requests += len(prepared)
    # Longest context first (the harness's order): a batch's contexts are then of nearly equal length.
    order = sorted(range(len(prepared)), key=lambda i: (-len(prepared[i][0].context),
                                                        -max(len(c) for c in prepared[i][0].continuations)))
    results: list[Optional[Scored]] = [None] * len(prepared)
    was_training = model.training
    model.eval()
    try:
        lengths = [len(req.context) for req, _ in prepared]
        for idx in length_batches(order, lengths, batch_size):
            batch = [prepared[i][0] for i in idx]
            out = _score_batch(model, batch, shared, stats)
            for i, (logliks, greedy) in zip(idx, out):
                results[i] = Scored(logliks, greedy, prepared[i][1])
            if progress is not None:
                progress(len(idx))
    finally:
        model.train(was_training)
    return results  # type: ignore[return-value]


def _score_batch(model, batch: list[Request], shared: bool, stats: ScoreStats):
    device = model.device
    P = min(len(r.context) for r in batch) if shared else 0
    first_logits = state = None
    if P > 0:
        ids = torch.tensor([r.context[:P] for r in batch], dtype=torch.long, device=device)
        out = model(ids, return_state=True, logits_to_keep=1)
        first_logits = out.logits[:, -1]  # predicts token P of each context
        state = out.state
        stats.forward_tokens += ids.numel()
    # One row per (request, continuation): the context past P, then the continuation.
    rows, owner, starts = [], [], []
    for b, r in enumerate(batch):
        for cont in r.continuations:
            rows.append(r.context[P:] + cont)
            owner.append(b)
            starts.append(len(r.context) - P)  # where the continuation starts in the row
    # Every scored token: the logits that predict it (position k of a row is predicted by position k - 1 of the
    # row's forward, or by the prefill's last logits for k = 0), its row and its id.
    parts = []  # (log p(target) [n], greedy [n], rows [n]) per forward
    first = [i for i in range(len(rows)) if starts[i] == 0]
    if first:
        pick = torch.tensor([owner[i] for i in first], device=device)
        tgt = torch.tensor([rows[i][0] for i in first], dtype=torch.long, device=device)
        parts.append((*target_logprobs(first_logits.index_select(0, pick), tgt), first))
    # The rows run longest first, at most 2 * batch_size to a forward (both ways): rows of similar length pad less.
    by_length = sorted((i for i in range(len(rows)) if len(rows[i]) > 1), key=lambda i: -len(rows[i]))
    per_forward = ROWS_PER_ITEM * len(batch)
    for g in range(0, len(by_length), per_forward):
        group = by_length[g:g + per_forward]
        T = len(rows[group[0]]) - 1  # the last token of a row is only a target
        ids = torch.full((len(group), T), PAD_ID, dtype=torch.long, device=device)
        local, pos, tgt = [], [], []
        for j, i in enumerate(group):
            s = rows[i]
            ids[j, :len(s) - 1] = torch.tensor(s[:-1], dtype=torch.long)
            for k in range(max(starts[i], 1), len(s)):
                local.append(j)
                pos.append(k - 1)
                tgt.append(s[k])
        row_state = None
        if state is not None:
            index = torch.tensor([owner[i] for i in group], dtype=torch.long, device=device)
            row_state = state.map(lambda t: t.index_select(0, index))
        stats.forward_tokens += sum(len(rows[i]) - 1 for i in group)
        if not local:
            continue
        at = (torch.tensor(local, device=device), torch.tensor(pos, device=device))
        tgt = torch.tensor(tgt, dtype=torch.long, device=device)
        if shared:  # the head only where a log-likelihood is read, a cache-sized chunk at a time
            scored = target_logprobs(model(ids, state=row_state, logits_at=at, apply_head=False), tgt,
                                     model.head_weight)
        else:  # a plain full pass: logits at every position, then read
            scored = target_logprobs(model(ids, state=row_state)[at], tgt)
        parts.append((*scored, [group[j] for j in local]))
    # log p(target) and whether the target is greedy (step 4 of the module doc), summed per row.
    picked = torch.cat([p for p, _, _ in parts])
    missed = torch.cat([(~g).to(torch.int64) for _, g, _ in parts])
    row = torch.tensor([i for _, _, of in parts for i in of], dtype=torch.long, device=device)
    ll = torch.zeros(len(rows), dtype=torch.float64, device=device).index_add_(0, row, picked.double())
    misses = torch.zeros(len(rows), dtype=torch.int64, device=device).index_add_(0, row, missed)
    if not bool(torch.isfinite(ll).all()):
        raise ShapeError("a continuation scored a non-finite log-likelihood; the model's weights hold NaN or inf")
    per_request: list[tuple[list[float], list[bool]]] = [([], []) for _ in batch]
    for i, (v, m) in enumerate(zip(ll.tolist(), misses.tolist())):
        per_request[owner[i]][0].append(v)
        per_request[owner[i]][1].append(m == 0)
    return per_request
