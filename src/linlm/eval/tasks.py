"""Zero-shot tasks in lm-evaluation-harness conventions: reading the local JSON Lines copies, turning documents into
scoring requests, and the metrics with their standard errors.

File formats (one JSON object per line, as in the public JSON Lines copies of these sets and llm-foundry's eval data):

==============  ===================================================  =============================================
kind            fields                                                request(s) per document
==============  ===================================================  =============================================
``choice``      ``query`` (prompt prefix), ``choices`` (list), ``gold``  context = query, continuations = " " + choice
``partial``     ``context_options`` (list), ``continuation``, ``gold``  one request per option: context = option,
                                                                       continuation = " " + continuation (WinoGrande)
``lambada``     ``context``, ``continuation``                           context, continuation = " " + continuation
``rolling``     ``text`` (scored), ``page`` (counted; default text)    the whole text, one rolling log-likelihood
==============  ===================================================  =============================================

Any record may carry ``delimiter``, the text put between prompt and continuation (lm-evaluation-harness'
``target_delimiter``); the task files that :mod:`linlm.eval.hub` converts from the dataset hub set it to " ", as
lm-eval does, always. Without it the delimiter is " ", left out when the prompt already ends with whitespace (so the
llm-foundry copies of PIQA, whose queries end in a newline, get no space before the answer). Metrics:

- ``acc``: the choice with the highest summed log-likelihood is the gold one (ties go to the first, as numpy's
  argmax in the harness).
- ``acc_norm``: the same after dividing each log-likelihood by the choice's length in UTF-8 bytes (the choice text
  without the delimiter; lm-evaluation-harness counts characters, identical for ASCII text).
- WinoGrande (partial scoring): the shared continuation is scored after each option; acc only.
- LAMBADA: ``acc`` is whether greedy decoding reproduces the last word (every token the argmax, the harness's
  ``is_greedy``); ``perplexity`` = exp(-mean log-likelihood of the last word).
- Rolling (WikiText-2, lm-eval's ``wikitext``): each document's whole-text log-likelihood LL_d
  (:func:`linlm.eval.perplexity.document_logliks`), summed over documents and divided by counts taken, as lm-eval
  takes them, from the *original* page (before detokenization): W_d its pieces split at runs of whitespace and
  B_d its UTF-8 bytes. ``word_perplexity`` = exp(-sum LL / sum W), ``byte_perplexity`` = exp(-sum LL / sum B),
  ``bits_per_byte`` = -sum LL / (sum B ln 2). lm-eval reports no standard error for them; neither does linlm.

Standard errors: for a mean of per-document values, the sample standard deviation (n - 1) over sqrt(n), as the
harness does; for perplexity, the delta method: ppl x stderr(mean negative log-likelihood).
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from linlm.cli_args import comma_list
from linlm.errors import ConfigError, DataError, choices_text
from linlm.eval.scoring import Request, Scored

log = logging.getLogger("linlm.eval")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    filename: str
    kind: str  # "choice" | "partial" | "lambada" | "rolling"
    metric: str  # the metric the paper reports: "acc" or "acc_norm" ("perplexity" for lambada is also reported;
    # "word_perplexity" for a rolling task)
    description: str


TASKS: dict[str, TaskSpec] = {t.name: t for t in (
    TaskSpec("piqa", "piqa.jsonl", "choice", "acc", "physical commonsense, 2 choices"),
    TaskSpec("hellaswag", "hellaswag.jsonl", "choice", "acc_norm", "sentence completion, 4 choices"),
    TaskSpec("arc_easy", "arc_easy.jsonl", "choice", "acc", "grade-school science, easy set"),
    TaskSpec("arc_challenge", "arc_challenge.jsonl", "choice", "acc_norm", "grade-school science, challenge set"),
    TaskSpec("openbookqa", "openbook_qa.jsonl", "choice", "acc_norm", "open-book science questions, 4 choices"),
    TaskSpec("boolq", "boolq.jsonl", "choice", "acc", "yes/no questions about a passage"),
    TaskSpec("winogrande", "winogrande.jsonl", "partial", "acc", "pronoun resolution, partial scoring"),
    TaskSpec("lambada", "lambada_openai.jsonl", "lambada", "acc", "last word of a passage: greedy accuracy and "
                                                                    "perplexity"),
    TaskSpec("wikitext2", "wikitext2.jsonl", "rolling", "word_perplexity",
             "WikiText-2 documents: word and byte perplexity, bits per byte"),
)}
# The paper's commonsense average (arXiv 2406.16690): these seven tasks, each with TASKS[name].metric.
COMMONSENSE = ("boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")
GROUPS = {"commonsense": COMMONSENSE, "all": tuple(TASKS)}


def resolve_tasks(spec: str | Sequence[str]) -> list[str]:
    """``"piqa,hellaswag"`` or a list -> task names (groups ``commonsense`` and ``all`` expand); duplicates dropped."""
    names = comma_list(spec if isinstance(spec, str) else ",".join(s for s in spec if s), "tasks", empty_ok=True)
    if not names:
        raise ConfigError(f"tasks: none given; valid tasks are {choices_text(TASKS)} (or the groups "
                          f"{choices_text(GROUPS)})")
    out: list[str] = []
    for n in names:
        expanded = GROUPS.get(n, (n,))
        for t in expanded:
            if t not in TASKS:
                raise ConfigError(f"tasks: unknown task {t!r}; valid tasks are {choices_text(TASKS)} (or the groups "
                                  f"{choices_text(GROUPS)})")
            if t not in out:
                out.append(t)
    return out


# ---- reading ---------------------------------------------------------------------------------------------------

def read_jsonl(path: str | Path, *, skip_bad: bool = False, validate=None, limit: Optional[int] = None
               ) -> tuple[list[dict], list[str]]:
    """Records of a JSON Lines file. A malformed line (not JSON, not an object, or refused by ``validate(record)``
    raising ValueError) raises DataError naming ``file:line``, or with ``skip_bad`` is skipped and reported in the
    second return value. Blank lines are ignored. ``limit`` stops after that many good records."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file; pass --data-dir with the task files ({', '.join(sorted({t.filename for t in TASKS.values()}))})")
    records: list[dict] = []
    skipped: list[str] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if limit is not None and len(records) >= limit:
                break
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
                if not isinstance(rec, dict):
                    raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
                if validate is not None:
                    validate(rec)
            except (ValueError, UnicodeDecodeError) as e:
                where = f"{path}:{lineno}"
                if not skip_bad:
                    raise DataError(f"{where}: malformed line ({e}); fix the line or pass --skip-bad-lines to skip "
                                    "it") from None
                skipped.append(f"{where}: {e}")
                continue
            records.append(rec)
    if skipped:
        log.warning("%s: skipped %d malformed line(s), first: %s", path, len(skipped), skipped[0])
    return records, skipped


def _need(rec: dict, key: str, kind: type):
    if key not in rec:
        raise ValueError(f"missing field {key!r}")
    value = rec[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"field {key!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _string_list(rec: dict, key: str) -> list[str]:
    value = _need(rec, key, list)
    if len(value) < 2 or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"field {key!r} must be a list of at least 2 non-empty strings")
    return value


def _gold(rec: dict, n: int) -> int:
    gold = _need(rec, "gold", int)
    if not 0 <= gold < n:
        raise ValueError(f"gold={gold} is not an index into the {n} choices")
    return gold


def validate_record(kind: str, rec: dict) -> None:
    if "delimiter" in rec:
        _need(rec, "delimiter", str)
    if kind == "choice":
        _need(rec, "query", str)
        _gold(rec, len(_string_list(rec, "choices")))
    elif kind == "partial":
        _need(rec, "continuation", str)
        _gold(rec, len(_string_list(rec, "context_options")))
    elif kind == "lambada":
        _need(rec, "context", str)
        if not _need(rec, "continuation", str).strip():
            raise ValueError("field 'continuation' is empty")
    elif kind == "rolling":
        if not _need(rec, "text", str).strip():
            raise ValueError("field 'text' is empty")
        if "page" in rec:
            _need(rec, "page", str)
    else:
        raise ConfigError(f"unknown task kind {kind!r}")


def load_task(spec: TaskSpec, data_dir: str | Path, *, limit: Optional[int] = None, skip_bad: bool = False
              ) -> tuple[list[dict], list[str]]:
    return read_jsonl(Path(data_dir) / spec.filename, skip_bad=skip_bad, limit=limit,
                      validate=lambda r: validate_record(spec.kind, r))


# ---- requests ----------------------------------------------------------------------------------------------------

def join(prompt: str, continuation: str, delimiter: Optional[str] = None) -> str:
    """The continuation with its delimiter: ``delimiter`` when given (a record's own), else " " unless the prompt
    is empty or already ends with whitespace."""
    if delimiter is not None:
        return delimiter + continuation
    return continuation if not prompt or prompt[-1:].isspace() else " " + continuation


def request_texts(kind: str, rec: dict) -> list[tuple[str, str]]:
    """A record's (context, continuation) strings, the delimiter in the continuation: one per choice (choice), one
    per option (partial), one (lambada). The strings lm-evaluation-harness' requests hold for the same document."""
    delim = rec.get("delimiter")
    if kind == "choice":
        return [(rec["query"], join(rec["query"], c, delim)) for c in rec["choices"]]
    if kind == "partial":
        return [(o, join(o, rec["continuation"], delim)) for o in rec["context_options"]]
    if kind == "lambada":
        return [(rec["context"], join(rec["context"], rec["continuation"], delim))]
    if kind == "rolling":
        return [(rec["text"],)]
    raise ConfigError(f"unknown task kind {kind!r}")


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Token ids of a context and its continuation, the harness's way: trailing whitespace of the context moves to
    the continuation, the whole text is encoded once (as a model's input: the BOS first when the tokenizer adds
    one, as lm-eval's HF wrapper encodes) and the continuation is what follows the context's tokens. An empty
    context is the prefix token (the BOS, else end-of-text)."""
    if not context:
        return [tokenizer.prefix_id], tokenizer.encode(continuation)
    n_space = len(context) - len(context.rstrip())
    if n_space:
        continuation = context[-n_space:] + continuation
        context = context[:-n_space]
    whole = tokenizer.encode_input(context + continuation)
    ctx = tokenizer.encode_input(context)
    return ctx, whole[len(ctx):]


@dataclass
class Doc:
    """A document turned into requests: ``requests`` (1 for choice/lambada, one per option for partial), the gold
    index and the byte lengths used by acc_norm."""

    requests: list[Request]
    gold: int
    choice_bytes: list[int]


def build_doc(kind: str, rec: dict, tokenizer) -> Doc:
    pairs = [encode_pair(tokenizer, ctx, cont) for ctx, cont in request_texts(kind, rec)]
    if kind == "choice":  # one context for all choices
        return Doc([Request(pairs[0][0], [cont for _, cont in pairs])], rec["gold"],
                   [len(c.encode("utf-8")) for c in rec["choices"]])
    n = len(rec["continuation"].encode("utf-8"))
    return Doc([Request(ctx, [cont]) for ctx, cont in pairs], rec.get("gold", 0), [n] * len(pairs))


# ---- metrics -----------------------------------------------------------------------------------------------------

def mean_stderr(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation with n - 1, over sqrt(n)); stderr is nan for n < 2."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    m = sum(values) / n
    if n < 2:
        return m, math.nan
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    return m, math.sqrt(var / n)


def _argmax(xs: Sequence[float]) -> int:
    best = 0
    for i, x in enumerate(xs):
        if x > xs[best]:
            best = i
    return best


def doc_metrics(kind: str, doc: Doc, scored: list[Scored]) -> dict[str, float]:
    """Per-document values: acc (and acc_norm for choice tasks; loglik for lambada)."""
    if kind == "lambada":
        s = scored[0]
        return {"acc": float(s.greedy[0]), "loglik": s.logliks[0]}
    lls = scored[0].logliks if kind == "choice" else [s.logliks[0] for s in scored]
    out = {"acc": float(_argmax(lls) == doc.gold)}
    if kind == "choice":
        out["acc_norm"] = float(_argmax([ll / max(b, 1) for ll, b in zip(lls, doc.choice_bytes)]) == doc.gold)
    return out


def aggregate(kind: str, per_doc: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(per_doc)}
    keys = ["acc", "acc_norm"] if kind == "choice" else ["acc"]
    for k in keys:
        out[k], out[k + "_stderr"] = mean_stderr([d[k] for d in per_doc])
    if kind == "lambada":
        nll, nll_se = mean_stderr([-d["loglik"] for d in per_doc])
        out["perplexity"] = math.exp(nll) if per_doc else math.nan
        out["perplexity_stderr"] = out["perplexity"] * nll_se
    return out


def rolling_aggregate(records: Sequence[dict], logliks: Sequence[float]) -> dict[str, Any]:
    """Word and byte perplexity and bits per byte of a rolling task (see the module doc), the counts lm-eval's
    way: words and bytes of each record's ``page`` (its text before detokenization; ``text`` when absent)."""
    originals = [r.get("page", r["text"]) for r in records]
    words = sum(len(re.split(r"\s+", p)) for p in originals)
    nbytes = sum(len(p.encode("utf-8")) for p in originals)
    ll = float(sum(logliks))
    return {"n": len(records), "loglik": ll, "words": words, "bytes": nbytes,
            "word_perplexity": math.exp(-ll / words), "byte_perplexity": math.exp(-ll / nbytes),
            "bits_per_byte": -ll / (nbytes * math.log(2))}


def commonsense_average(results: dict[str, dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The paper's average over the 7 commonsense tasks (each with its own metric); None unless all 7 were run.
    Its standard error treats the tasks as independent: sqrt(sum se_i^2) / 7."""
    if not all(t in results for t in COMMONSENSE):
        return None
    vals = [results[t][TASKS[t].metric] for t in COMMONSENSE]
    ses = [results[t][TASKS[t].metric + "_stderr"] for t in COMMONSENSE]
    return {"score": sum(vals) / len(vals), "stderr": math.sqrt(sum(s * s for s in ses)) / len(ses),
            "metrics": {t: TASKS[t].metric for t in COMMONSENSE}}
