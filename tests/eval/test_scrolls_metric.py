"""SCROLLS' metrics computed offline (linlm.eval.scrolls_metric): by hand, against the ``rouge_score`` package
SCROLLS' own script calls, and plugged into lm-evaluation-harness' own SCROLLS task objects on local rows in the
hub's format, with the hub unreachable."""

import json
import random
from pathlib import Path

import pytest

from linlm.eval.scrolls_metric import (DATASET_METRICS, ScrollsMetric, exact_match, lcs_length, normalize_answer,
                                       offline_scrolls_metric, rouge_l, rouge_n, rouge_tokens, token_f1)

ROWS = Path(__file__).parent / "data" / "long"

PREDICTIONS = ["exact match example", "hello there", "general kenobi"]
REFERENCES = [["exact match example"], ["hello", "hi there"], ["commander kenobi"]]


def test_the_three_kinds_by_hand():
    """The best reference per prediction, then the mean x 100. ROUGE-1: 1, max(2/3 against "hello", 1/2), 1/2;
    ROUGE-2: only the first prediction shares a bigram; F1 as ROUGE-1 here; exact match: one of three."""
    rouge = ScrollsMetric("gov_report").compute(predictions=PREDICTIONS, references=REFERENCES)
    assert rouge["rouge/rouge1"] == pytest.approx(72.2222, abs=1e-4)
    assert rouge["rouge/rouge2"] == pytest.approx(33.3333, abs=1e-4)
    assert rouge["rouge/rougeL"] == pytest.approx(72.2222, abs=1e-4)
    assert rouge["rouge/geometric_mean"] == pytest.approx((72.2222 * 33.3333 * 72.2222) ** (1 / 3), abs=1e-3)
    assert rouge["num_predicted"] == 3 and "f1" not in rouge
    assert ScrollsMetric("narrative_qa").compute(predictions=PREDICTIONS, references=REFERENCES)["f1"] == \
        pytest.approx(72.2222, abs=1e-4)
    assert ScrollsMetric("contract_nli").compute(predictions=PREDICTIONS, references=REFERENCES)["exact_match"] == \
        pytest.approx(33.3333, abs=1e-4)


def test_squad_normalisation_f1_and_exact_match():
    assert normalize_answer("  The Old-Man, an heir!  ") == "oldman heir"
    assert exact_match("The old man.", "old man") == 1.0 and exact_match("old men", "old man") == 0.0
    # "the cat sat on mat" vs "cat on a mat": after normalisation 4 and 3 tokens, 3 shared (cat, on, mat)
    assert token_f1("the cat sat on the mat", "cat on a mat") == pytest.approx(2 * (3 / 4) * (3 / 3) / (3 / 4 + 1))
    assert token_f1("dog", "cat") == 0.0 and token_f1("", "cat") == 0.0
    # repeated tokens count once per occurrence on both sides
    assert token_f1("a b b b", "b b") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))


def test_rouge_tokens_and_lcs():
    assert rouge_tokens("Ten-percent rise, 2026!  ÉTÉ") == ["ten", "percent", "rise", "2026", "t"]  # É is no a-z
    assert lcs_length("abcbdab", "bdcaba") == 4 and lcs_length("", "abc") == 0
    assert rouge_l("", "some words") == 0.0 and rouge_n("one", "one", 2) == 0.0  # no bigram on either side


def _texts(rng: random.Random, n: int) -> list[str]:
    words = ["the", "council", "budget", "roads", "rose", "parks", "cut", "Bridge", "river", "ten", "percent", "a",
             "two-lane", "ferry,", "spring.", "vote", "(next)", "month", "roads", "the"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 18))) for _ in range(n)]


def test_rouge_equals_the_rouge_score_package():
    """Pair by pair, ROUGE-1/2/L F-measures equal rouge_score's without a stemmer (the scorer SCROLLS' script
    calls), on texts with punctuation, repeats, capitals and empty strings."""
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    rng = random.Random(0)
    preds, refs = _texts(rng, 200), _texts(rng, 200)
    for p, r in zip(preds, refs):
        want = scorer.score(r, p)  # rouge_score takes (target, prediction)
        assert rouge_n(p, r, 1) == pytest.approx(want["rouge1"].fmeasure, abs=1e-12)
        assert rouge_n(p, r, 2) == pytest.approx(want["rouge2"].fmeasure, abs=1e-12)
        assert rouge_l(p, r) == pytest.approx(want["rougeL"].fmeasure, abs=1e-12)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no SCROLLS dataset 'govreport'"):
        ScrollsMetric("govreport")
    metric = ScrollsMetric("qasper")
    with pytest.raises(ValueError, match="2 predictions but 1 reference lists"):
        metric.compute(predictions=["a", "b"], references=[["a"]])
    with pytest.raises(ValueError, match="no predictions"):
        metric.compute(predictions=[], references=[])
    with pytest.raises(ValueError, match="has no reference"):
        metric.compute(predictions=["a"], references=[[]])


@pytest.mark.parametrize("task_name,rows,metric_keys", [
    ("GovReport", "scrolls_govreport.jsonl", {"rouge1": "rouge1", "rouge2": "rouge2", "rougeL": "rougeL"}),
    ("NarrativeQA", "scrolls_narrativeqa.jsonl", {"f1": None}),
])
def test_lm_evals_scrolls_tasks_score_offline(task_name, rows, metric_keys, monkeypatch, tmp_path, model_dir,
                                              tokenizer):
    """lm-eval's own GovReport and NarrativeQA objects, built with the hub unreachable: the metric they take is
    linlm's, and the scores lm-eval aggregates from the model's answers (fixed here, so that they overlap the
    references) equal rouge_score's ROUGE and SQuAD's F1 over each document's references, the best one."""
    pytest.importorskip("lm_eval")
    import datasets

    from linlm import load
    from linlm.eval.harness import LinlmLM
    from linlm.eval.long_tasks import run_long_tasks, squad_normalizer_shim

    for var, value in [("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("HF_HOME", str(tmp_path / "hf")),
                       ("HF_DATASETS_CACHE", str(tmp_path / "hf-data"))]:
        monkeypatch.setenv(var, value)
    squad_normalizer_shim()
    import lm_eval.tasks.scrolls.task as scrolls

    real_load = scrolls.load
    cls = getattr(scrolls, task_name)

    class Local(cls):
        def download(self, *args, **kwargs):
            self.dataset = datasets.load_dataset("json", data_files={s: str(ROWS / rows) for s in
                                                                     ("train", "validation")},
                                                 cache_dir=str(tmp_path / "rows"))
            for s in self.dataset:
                self.dataset[s] = scrolls._drop_duplicates_in_input(self.dataset[s])

    with offline_scrolls_metric():
        task = Local()
    assert isinstance(task.metric, ScrollsMetric) and scrolls.load is real_load  # put back on leaving
    docs = list(task.validation_docs())
    answers = [f"{' '.join(doc['outputs'][-1].split()[:4])} and more words" for doc in docs]
    monkeypatch.setattr(LinlmLM, "generate_until", lambda self, requests, disable_tqdm=False:
                        [answers[[d["id"] for d in docs].index(r.doc["id"])] for r in requests])
    name = f"scrolls_{task_name.lower()}"
    out = run_long_tasks(load(model_dir).eval(), tokenizer, [name], task_dict={name: task})
    got = out["tasks"][name]
    if "f1" in metric_keys:
        want = sum(max(token_f1(a, ref) for ref in d["outputs"]) for a, d in zip(answers, docs)) / len(docs)
        assert got["f1"] == pytest.approx(100 * want, abs=1e-4) and got["f1"] > 0
    else:
        rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
        scorer = rouge_scorer.RougeScorer(list(metric_keys), use_stemmer=False)
        for key in metric_keys:
            want = sum(max(scorer.score(ref, a)[key].fmeasure for ref in d["outputs"])
                       for a, d in zip(answers, docs)) / len(docs)
            assert got[key] == pytest.approx(100 * want, abs=1e-4) and got[key] > 0
    assert got["n"] == len(docs) == 2
    json.dumps(out)  # the result is plain data


def test_every_scrolls_dataset_has_its_metrics():
    """lm-eval's seven SCROLLS tasks name datasets this module scores, with the metrics long_tasks reports."""
    from linlm.eval.long_tasks import SCROLLS_METRICS

    kinds = {"rouge1": "rouge", "rouge2": "rouge", "rougeL": "rouge", "f1": "f1", "em": "exact_match"}
    names = {"scrolls_govreport": "gov_report", "scrolls_summscreenfd": "summ_screen_fd", "scrolls_qmsum": "qmsum",
             "scrolls_qasper": "qasper", "scrolls_narrativeqa": "narrative_qa", "scrolls_quality": "quality",
             "scrolls_contractnli": "contract_nli"}
    assert set(names) == set(SCROLLS_METRICS)
    for task, ms in SCROLLS_METRICS.items():
        assert {kinds[m] for m in ms} == set(DATASET_METRICS[names[task]])
