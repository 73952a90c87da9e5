"""Run zero-shot tasks on a model: ``evaluate(model, tokenizer, ["piqa", "hellaswag"], data_dir)`` -> results dict.

The results hold, per task, the metrics with standard errors (see :mod:`linlm.eval.tasks`), the number of
documents, the requests whose context was truncated from the left and the malformed lines skipped; plus the
commonsense average when all 7 of its tasks were run. :func:`write_json` writes them as JSON.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from linlm.errors import ConfigError, DataError
from linlm.eval.scoring import ScoreStats, model_max_length, score_requests
from linlm.eval.tasks import (TASKS, aggregate, build_doc, commonsense_average, doc_metrics, load_task, resolve_tasks,
                              rolling_aggregate)
from linlm.progress import ProgressBar

log = logging.getLogger("linlm.eval")

RESULTS_FORMAT = "linlm-eval"


def evaluate(model, tokenizer, tasks: str | Sequence[str], data_dir: str | Path, *, limit: Optional[int] = None,
             batch_size: int = 16, skip_bad: bool = False, shared: bool = True, max_length: Optional[int] = -1,
             drop_overlong: bool = False, show_progress: bool = False) -> dict[str, Any]:
    """Evaluate ``model`` on ``tasks`` read from ``data_dir`` (the JSON Lines files named in tasks.TASKS).

    ``max_length``: -1 takes the model's own limit, None means none; contexts beyond it are cut from the left. A
    document with a continuation longer than ``max_length`` is an error, unless ``drop_overlong``: then it is left
    out and counted (``dropped_docs``), so that models compared at one ``max_length`` score the same documents."""
    names = resolve_tasks(tasks)
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be >= 1, got {limit}")
    tokenizer.ensure_fits(model.config.vocab_size)
    data_dir = check_data_dir(data_dir)
    results: dict[str, Any] = {}
    for name in names:
        spec = TASKS[name]
        t0 = time.perf_counter()
        records, skipped = load_task(spec, data_dir, limit=limit, skip_bad=skip_bad)
        if not records:
            raise DataError(f"{data_dir / spec.filename}: holds no usable document")
        if spec.kind == "rolling":  # whole documents, no requests to share
            from linlm.eval.perplexity import document_logliks

            window = model_max_length(model) if max_length == -1 else max_length
            res = rolling_aggregate(records, document_logliks(model, tokenizer, [r["text"] for r in records], window))
            res.update(metric=spec.metric, file=str(data_dir / spec.filename), skipped_lines=len(skipped),
                       max_length=window, seconds=round(time.perf_counter() - t0, 3))
            results[name] = res
            continue
        docs = [build_doc(spec.kind, r, tokenizer) for r in records]
        dropped = 0
        if drop_overlong:
            limit_len = model_max_length(model) if max_length == -1 else max_length
            if limit_len is not None:
                kept = [d for d in docs if all(max(len(c) for c in q.continuations) <= limit_len
                                               for q in d.requests)]
                dropped, docs = len(docs) - len(kept), kept
                if not docs:
                    raise DataError(f"{name}: every document has a continuation longer than {limit_len} tokens; "
                                    "evaluate with a longer max_length")
                if dropped:
                    log.warning("%s: %d of %d documents have a continuation longer than %d tokens and are left out",
                                name, dropped, dropped + len(docs), limit_len)
        flat = [req for d in docs for req in d.requests]
        stats = ScoreStats()
        with ProgressBar(name, len(flat), elapsed=False, enabled=None if show_progress else False) as bar:
            scored = score_requests(model, flat, batch_size=batch_size, shared=shared, max_length=max_length,
                                    stats=stats, progress=(lambda n: bar.update(advance=n)) if bar.active else None)
        per_doc, i = [], 0
        for d in docs:
            per_doc.append(doc_metrics(spec.kind, d, scored[i:i + len(d.requests)]))
            i += len(d.requests)
        res = aggregate(spec.kind, per_doc)
        res.update(metric=spec.metric, file=str(data_dir / spec.filename), skipped_lines=len(skipped),
                   truncated_requests=stats.truncated_requests, dropped_docs=dropped,
                   seconds=round(time.perf_counter() - t0, 3))
        if stats.truncated_requests:
            log.warning("%s: %d of %d requests were longer than the model takes; their contexts were truncated "
                        "from the left", name, stats.truncated_requests, stats.requests)
        results[name] = res
    out: dict[str, Any] = {"format": RESULTS_FORMAT, "tasks": results,
                           "settings": {"limit": limit, "batch_size": batch_size, "shared_context": shared}}
    avg = commonsense_average(results)
    if avg is not None:
        out["commonsense_avg"] = avg
    return out


def check_data_dir(data_dir: str | Path) -> Path:
    """The task directory (``~`` expanded), refused in one line unless it is a directory (the CLI checks it before
    the model loads)."""
    data_dir = Path(data_dir).expanduser()
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: not a directory; pass --data-dir with the task files (JSON Lines)")
    return data_dir


def results_rows(results: dict[str, Any]) -> list[list[str]]:
    """Table rows: task, the paper's metric, value +- stderr, acc, acc_norm, perplexity, n."""

    def pm(d, k, scale=100.0):
        if k not in d:
            return "-"
        return f"{scale * d[k]:.2f} ± {scale * d[k + '_stderr']:.2f}"

    rows = []
    for name, d in results["tasks"].items():
        if "word_perplexity" in d:  # a rolling task: perplexities, no accuracy
            rows.append([name, d["metric"], "-", "-", "-", f"{d['word_perplexity']:.3f} (word), "
                         f"{d['byte_perplexity']:.4f} (byte), {d['bits_per_byte']:.4f} bits/byte", str(d["n"])])
            continue
        rows.append([name, d["metric"], pm(d, d["metric"]), pm(d, "acc"), pm(d, "acc_norm"),
                     pm(d, "perplexity", 1.0), str(d["n"])])
    avg = results.get("commonsense_avg")
    if avg:
        rows.append(["commonsense avg (7)", "per task", f"{100 * avg['score']:.2f} ± {100 * avg['stderr']:.2f}",
                     "-", "-", "-", "-"])
    return rows


RESULTS_HEADERS = ["task", "metric", "score (%)", "acc (%)", "acc_norm (%)", "perplexity", "n"]


def write_json(path: str | Path, obj: dict[str, Any], fmt: str = RESULTS_FORMAT, what: Optional[str] = None) -> Path:
    """Write ``obj`` with ``"format": fmt`` through :func:`linlm.outputs.write_json` (atomic; a file linlm did not
    write is refused, never replaced). ``what`` names the flag in a refusal, e.g. ``--json``."""
    from linlm import outputs

    return outputs.write_json(path, {**obj, "format": fmt}, what, indent=2)
