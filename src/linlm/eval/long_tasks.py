"""Long-context tasks run by lm-evaluation-harness itself through linlm's adapter: SCROLLS (arXiv 2201.03533, the
scaling paper's long-context set, arXiv 2406.16690) and the recall tasks the linear-model papers report (SWDE, FDA,
SQuAD-completion: lm-eval's ``based`` recall tasks; RULER's needle-in-a-haystack variants, whose prompts lm-eval
generates for one length, ``max_context``, with the model's own tokenizer).

lm-eval builds every request and aggregates every metric; linlm answers the requests
(:class:`linlm.eval.harness.LinlmLM`: greedy generation from the recurrent state, log-likelihoods from one
prefill) with the context cut of the adapter: each input longer than ``max_context`` tokens keeps its last
``max_context`` (from the left; SCROLLS and recall prompts end with the question, so it stays), and the counts
of cut requests are returned beside the scores.

Metrics (lm-eval's, on its scale): ROUGE-1/2/L for GovReport, SummScreenFD and QMSum; F1 for Qasper and
NarrativeQA; EM (exact match of the chosen option, x 100) for QuALITY and ContractNLI; ``contains`` (the gold
value occurs in the answer) for the recall tasks. SCROLLS' ROUGE and F1 are computed by
:mod:`linlm.eval.scrolls_metric` (SCROLLS' definitions), which lm-eval's tasks take instead of the metric script
they would otherwise fetch from the dataset hub, so scoring needs no network. ``scrolls_average`` is the SCROLLS paper's average as the scaling
paper reports it: the plain mean of those 13 numbers (3 tasks x 3 ROUGE, 2 F1, 2 EM), given only when all 7 tasks ran.

The data come from the dataset hub through lm-eval (its own download code and the ``datasets`` cache); a task whose
data are neither cached nor reachable is a one-line DataError.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from linlm.errors import ConfigError, DataError
from linlm.eval.scrolls_metric import normalize_answer, offline_scrolls_metric

SCROLLS_METRICS = {"scrolls_govreport": ("rouge1", "rouge2", "rougeL"),
                   "scrolls_summscreenfd": ("rouge1", "rouge2", "rougeL"),
                   "scrolls_qmsum": ("rouge1", "rouge2", "rougeL"),
                   "scrolls_qasper": ("f1",), "scrolls_narrativeqa": ("f1",),
                   "scrolls_quality": ("em",), "scrolls_contractnli": ("em",)}
# RULER's needle-in-a-haystack variants (Hsieh et al., arXiv 2404.06654), as lm-eval builds them: synthetic
# prompts sized with the model's own tokenizer to one length, scored by string match (the share of the gold values
# the answer contains, 0-1). Three make their haystack in place; the others read Paul Graham's essays from the hub.
RULER_NIAH = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
              "niah_multikey_3", "niah_multiquery", "niah_multivalue")
RULER_OFFLINE = ("niah_single_1", "niah_multikey_2", "niah_multikey_3")
RULER_LENGTH = 4096  # lm-eval's default length, where no --max-length (max_context) gives one
RULER_ANSWER_TOKENS = 128  # what lm-eval's RULER tasks leave for the answer in every prompt
RECALL_METRICS = {"swde": ("contains",), "fda": ("contains",), "squad_completion": ("contains",),
                  **{t: ("acc",) for t in RULER_NIAH}}
METRICS = {**SCROLLS_METRICS, **RECALL_METRICS}
LONG_GROUPS = {"scrolls": tuple(SCROLLS_METRICS), "recall": ("swde", "fda", "squad_completion", *RULER_OFFLINE),
               "ruler_niah": RULER_NIAH}


def squad_normalizer_shim() -> None:
    """lm-eval 0.4.13's SCROLLS module imports ``transformers.data.metrics.squad_metrics`` (for Qasper's
    ``normalize_answer``), which transformers 5 removed: with transformers 5 the module does not import at all.
    Where that import fails, this registers a stand-in module holding ``normalize_answer``, SQuAD's answer
    normalization (lower case, punctuation and the articles a/an/the removed, whitespace collapsed); nothing is done
    where transformers still has it."""
    import sys

    try:
        import transformers.data.metrics.squad_metrics  # noqa: F401
        return
    except ImportError:
        pass
    import types

    metrics = types.ModuleType("transformers.data.metrics")
    squad = types.ModuleType("transformers.data.metrics.squad_metrics")
    squad.normalize_answer = normalize_answer
    metrics.squad_metrics = squad
    sys.modules.setdefault("transformers.data.metrics", metrics)
    sys.modules.setdefault("transformers.data.metrics.squad_metrics", squad)


def split_tasks(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """(linlm's own task names, lm-eval's long-context task names) of ``names``, the groups ``scrolls`` and
    ``recall`` expanded; a name of neither kind is left with linlm's (whose check names the valid ones)."""
    own: list[str] = []
    long: list[str] = []
    for n in names:
        for t in LONG_GROUPS.get(n, (n,)):
            (long if t in METRICS else own).append(t)
    return own, list(dict.fromkeys(long))


def scrolls_average(results: dict[str, dict]) -> Optional[float]:
    """The mean of the 13 SCROLLS metrics (see the module doc); None unless all 7 tasks are in ``results``."""
    if not all(t in results for t in SCROLLS_METRICS):
        return None
    values = [results[t][m] for t, ms in SCROLLS_METRICS.items() for m in ms]
    return sum(values) / len(values)


def ruler_tasks(names: Sequence[str], tokenizer, length: int) -> dict:
    """lm-eval's RULER NIAH tasks ``names``, their prompts generated for ``length`` tokens with ``tokenizer`` (saved
    for lm-eval to load with transformers' AutoTokenizer, as RULER sizes its prompts by it). A length too short for
    RULER's template, one needle and 128 answer tokens is a ConfigError."""
    import tempfile

    from lm_eval.tasks import TaskManager, get_task_dict

    with tempfile.TemporaryDirectory(prefix="linlm-ruler-tok-") as tmp:
        tokenizer.save(tmp)
        try:
            return get_task_dict(list(names), TaskManager(metadata={"tokenizer": tmp, "max_seq_lengths": [length]}))
        except ImportError as e:
            raise ConfigError(f"{', '.join(names)}: lm-eval's RULER tasks need wonderwords and nltk ({e.msg}); "
                              "pip install 'linlm[eval]'") from None
        except ValueError as e:
            if "Could not generate any sample" in str(e):
                raise ConfigError(f"{', '.join(names)}: RULER cannot fit its prompt, a needle and {RULER_ANSWER_TOKENS} answer tokens "
                                  f"in {length} tokens; give a longer --max-length (512 or more)") from None
            raise


def run_long_tasks(model, tokenizer, names: Sequence[str], *, limit: Optional[int] = None,
                   max_context: Optional[int] = None, batch_size: int = 16, task_dict: Optional[dict] = None
                   ) -> dict[str, Any]:
    """lm-eval's tasks ``names`` on ``model`` through the adapter, inputs cut to ``max_context`` tokens.

    Returns ``{"tasks": {name: {metric: value}}, "cut": the adapter's counts, "scrolls_avg": ...}``.
    ``task_dict`` (name -> lm-eval task object) replaces lm-eval's task lookup (tests build the task objects on
    local rows)."""
    try:
        from lm_eval.evaluator import evaluate as lm_eval_evaluate
        from lm_eval.tasks import TaskManager, get_task_dict
    except ImportError:
        raise ConfigError("the long-context tasks run through lm-evaluation-harness: pip install 'linlm[eval]'") \
            from None
    from linlm.eval.harness import LinlmLM

    squad_normalizer_shim()
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise ConfigError(f"tasks: {', '.join(unknown)} are not long-context tasks; valid ones are "
                          f"{', '.join(METRICS)} (or the groups {', '.join(LONG_GROUPS)})")
    lm = LinlmLM(model=model, tokenizer=tokenizer, batch_size=batch_size, max_context=max_context)
    length = max_context or RULER_LENGTH
    if task_dict is None:
        try:
            task_dict = {}
            rest = [n for n in names if n not in RULER_NIAH]
            if rest:
                with offline_scrolls_metric():
                    task_dict = get_task_dict(rest, TaskManager())
            ruler = [n for n in names if n in RULER_NIAH]
            if ruler:
                task_dict.update(ruler_tasks(ruler, tokenizer, length))
        except ConfigError:
            raise
        except (ConnectionError, OSError, ValueError) as e:
            raise DataError(f"{', '.join(names)}: lm-eval could not load the data ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''}); run where the dataset hub can be "
                            "reached once (lm-eval caches the data), or use `linlm eval fetch` and --data-dir for "
                            "linlm's own tasks") from None
    out = lm_eval_evaluate(lm=lm, task_dict=task_dict, limit=limit, bootstrap_iters=0)
    tasks = {}
    for name in names:
        got = out["results"].get(name, {})
        if name in RULER_NIAH:  # lm-eval names RULER's metric by the length; -1: no sample of that length
            value = got.get(f"{length},none")
            tasks[name] = {"acc": float(value)} if isinstance(value, (int, float)) and value != -1 else {}
            tasks[name]["length"] = length
        else:
            tasks[name] = {m: float(got[m + ",none"]) for m in METRICS[name] if m + ",none" in got}
        tasks[name]["n"] = int(out.get("n-samples", {}).get(name, {}).get("effective", 0))
    return {"tasks": tasks, "cut": dict(lm.cuts), "max_context": max_context,
            "scrolls_avg": scrolls_average(tasks)}
