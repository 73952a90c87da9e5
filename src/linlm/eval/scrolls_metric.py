"""SCROLLS' metrics, computed here so that the SCROLLS tasks score offline.

lm-evaluation-harness' SCROLLS tasks fetch their metric as a script from the dataset hub (``tau/scrolls``,
``metrics/scrolls.py``) each time a task object is built, and run it with ``evaluate``: without the hub no
SCROLLS task can even be constructed, and with it, code from the hub runs on the user's machine.
:func:`offline_scrolls_metric` hands lm-eval this module's :class:`ScrollsMetric` instead; the requests, the answers'
post-processing and the aggregation stay lm-eval's.

The definitions are SCROLLS' (Shaham et al., arXiv 2201.03533, section 4, and its metric script):

- **exact match** (QuALITY, ContractNLI): 100 x the share of predictions equal to some reference after SQuAD's
  answer normalisation (lower case, punctuation and the articles a/an/the removed, whitespace collapsed);
- **F1** (Qasper, NarrativeQA): SQuAD's token F1 between the normalised prediction and each reference, the best
  reference per prediction, the mean x 100;
- **ROUGE-1, ROUGE-2, ROUGE-L** (GovReport, SummScreenFD, QMSum): F-measures as the ``rouge_score`` package computes
  them without a stemmer (lower case, every run of characters outside a-z0-9 a separator; ROUGE-N from clipped
  n-gram counts, ROUGE-L from the longest common subsequence of tokens), the best reference per prediction, the
  mean x 100; the script's geometric mean of the three is given too. ROUGE-Lsum (the script also computes it, the
  scores never show it) is left out.

Values are rounded to 4 decimals, as the script rounds them.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from contextlib import contextmanager
from typing import Iterator, Sequence

# Each SCROLLS dataset's metrics, keyed by lm-eval's DATASET_NAME (the script's configuration names).
DATASET_METRICS = {"gov_report": ("rouge",), "summ_screen_fd": ("rouge",), "qmsum": ("rouge",),
                   "qasper": ("f1",), "narrative_qa": ("f1",),
                   "quality": ("exact_match",), "contract_nli": ("exact_match",)}

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, punctuation removed, the articles a/an/the removed, whitespace
    collapsed to single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the normalised texts are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD's token F1 of the normalised texts (0.0 when they share no token)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def rouge_tokens(text: str) -> list[str]:
    """ROUGE's tokens (``rouge_score``'s default tokenizer, no stemmer): lower case, split at every run of
    characters outside a-z and 0-9."""
    return _NON_ALNUM.sub(" ", text.lower()).split()


def _f_measure(overlap: int, n_pred: int, n_ref: int) -> float:
    precision, recall = overlap / max(n_pred, 1), overlap / max(n_ref, 1)
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def rouge_n(prediction: str, reference: str, n: int) -> float:
    """ROUGE-N F-measure: n-grams of the two token lists, counts clipped to the smaller of the two."""
    def grams(tokens: list[str]) -> Counter:
        return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))

    p, r = grams(rouge_tokens(prediction)), grams(rouge_tokens(reference))
    return _f_measure(sum((p & r).values()), sum(p.values()), sum(r.values()))


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of ``a`` and ``b`` (one row of the table at a time)."""
    if len(a) < len(b):
        a, b = b, a
    row = [0] * (len(b) + 1)
    for x in a:
        diag = 0
        for j, y in enumerate(b, 1):
            diag, row[j] = row[j], diag + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F-measure: the longest common subsequence of the token lists over each one's length."""
    p, r = rouge_tokens(prediction), rouge_tokens(reference)
    if not p or not r:
        return 0.0
    return _f_measure(lcs_length(p, r), len(p), len(r))


def _best_mean(fn, predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """100 x the mean over predictions of the best score against any of that prediction's references."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} reference lists")
    if not predictions:
        raise ValueError("no predictions to score")
    best = []
    for pred, refs in zip(predictions, references):
        refs = [refs] if isinstance(refs, str) else list(refs)
        if not refs:
            raise ValueError(f"prediction {pred!r} has no reference")
        best.append(max(fn(pred, ref) for ref in refs))
    return 100.0 * sum(best) / len(best)


class ScrollsMetric:
    """The SCROLLS metric of one dataset, with the ``compute(predictions=, references=)`` of an ``evaluate``
    metric: its keys are the script's (``rouge/rouge1``, ``rouge/rouge2``, ``rouge/rougeL``,
    ``rouge/geometric_mean``, ``f1``, ``exact_match``, ``num_predicted``)."""

    def __init__(self, config_name: str):
        if config_name not in DATASET_METRICS:
            raise ValueError(f"no SCROLLS dataset {config_name!r}; known: {', '.join(DATASET_METRICS)}")
        self.config_name = config_name

    def compute(self, *, predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
        out: dict[str, float] = {}
        for metric in DATASET_METRICS[self.config_name]:
            if metric == "rouge":
                r1 = _best_mean(lambda p, r: rouge_n(p, r, 1), predictions, references)
                r2 = _best_mean(lambda p, r: rouge_n(p, r, 2), predictions, references)
                rl = _best_mean(rouge_l, predictions, references)
                out.update({"rouge/rouge1": r1, "rouge/rouge2": r2, "rouge/rougeL": rl,
                            "rouge/geometric_mean": (r1 * r2 * rl) ** (1.0 / 3.0)})
            elif metric == "f1":
                out["f1"] = _best_mean(token_f1, predictions, references)
            else:
                out["exact_match"] = _best_mean(exact_match, predictions, references)
        out = {k: round(v, 4) for k, v in out.items()}
        out["num_predicted"] = len(predictions)
        return out


@contextmanager
def offline_scrolls_metric() -> Iterator[None]:
    """While open, lm-eval's SCROLLS task objects built here take :class:`ScrollsMetric` for their metric instead
    of fetching SCROLLS' script from the dataset hub (see the module doc). A no-op where lm-eval has no SCROLLS
    module."""
    try:
        import lm_eval.tasks.scrolls.task as scrolls
    except ImportError:
        yield
        return
    saved = scrolls._download_metric, scrolls.load
    scrolls._download_metric = lambda: "linlm.eval.scrolls_metric"
    scrolls.load = lambda _path, config_name: ScrollsMetric(config_name)
    try:
        yield
    finally:
        scrolls._download_metric, scrolls.load = saved
