"""Long-context tasks through lm-evaluation-harness' own task objects, on local rows in the hub's formats
(tests/eval/data/long): one test per task kind (generation: the recall tasks and SCROLLS' QA and summaries;
multiple choice: QuALITY, ContractNLI). The adapter's context cut keeps the end of each prompt (the question),
counts what it cut, and lm-eval's metrics are computed on what linlm answered."""

from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from linlm import load  # noqa: E402
from linlm.eval.long_tasks import (LONG_GROUPS, SCROLLS_METRICS, run_long_tasks, scrolls_average,  # noqa: E402
                                   split_tasks, squad_normalizer_shim)
from linlm.eval.scrolls_metric import offline_scrolls_metric  # noqa: E402

ROWS = Path(__file__).parent / "data" / "long"


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def _local(cls, splits, rows: Path, cache: Path, after=None):
    """lm-eval's task class ``cls`` reading ``rows`` as each of its ``splits`` instead of the hub."""
    import datasets

    class Local(cls):
        def download(self, *args, **kwargs):
            self.dataset = datasets.load_dataset("json", data_files={s: str(rows) for s in splits}, cache_dir=str(cache))
            if after is not None:
                for s in self.dataset:
                    self.dataset[s] = after(self.dataset[s])

    return Local()


def _recording(monkeypatch):
    """Every Request the adapter scores, as given to score_requests (after lm-eval built it)."""
    import linlm.eval.harness as harness

    seen = []
    real = harness.score_requests

    def score(model, reqs, **kw):
        seen.append((list(reqs), kw.get("max_length")))
        return real(model, reqs, **kw)

    monkeypatch.setattr(harness, "score_requests", score)
    return seen


def test_groups_and_the_scrolls_average():
    assert split_tasks(["piqa", "scrolls", "swde"]) == (["piqa"], [*LONG_GROUPS["scrolls"], "swde"])
    results = {t: {m: 10.0 * (i + 1) for m in ms} for i, (t, ms) in enumerate(SCROLLS_METRICS.items())}
    values = [10.0 * (i + 1) for i, ms in enumerate(SCROLLS_METRICS.values()) for _ in ms]
    assert len(values) == 13 and scrolls_average(results) == pytest.approx(sum(values) / 13)
    del results["scrolls_qmsum"]
    assert scrolls_average(results) is None


def test_generation_task_recall_swde(offline, tmp_path, model_dir, tokenizer):
    """SWDE (generate_until, lm-eval's `contains`): prompts longer than max_context keep their last tokens, room
    left for max_gen_toks; the score is lm-eval's metric on linlm's greedy answers from those cut prompts."""
    from lm_eval.tasks.swde.task import SWDE, contains_score

    from linlm.models.generation import generate_ids

    model = load(model_dir).eval()
    task = _local(SWDE, ["validation"], ROWS / "swde.jsonl", tmp_path / "hf")
    out = run_long_tasks(model, tokenizer, ["swde"], max_context=96, task_dict={"swde": task})
    docs = list(task.validation_docs())
    keep = 96 - 48  # SWDE asks for at most 48 new tokens
    hits, cut = [], 0
    for doc in docs:
        ids = tokenizer.encode_input(task.doc_to_text(doc))
        cut += len(ids) > keep
        new = generate_ids(model, ids[-keep:], 48, temperature=0.0, top_k=0, eos_id=tokenizer.eos_id)
        text = tokenizer.decode(new[:-1] if new and new[-1] == tokenizer.eos_id else new).split("\n")[0]
        hits.append(contains_score(text, [task.doc_to_target(doc)]))
    assert cut == 2  # the two long pages; the short one is whole
    assert out["cut"] == {"window": 96, "requests": 3, "cut": 2,
                          "longest_input": max(len(tokenizer.encode_input(task.doc_to_text(d))) for d in docs)}
    assert out["tasks"]["swde"]["contains"] == pytest.approx(sum(hits) / len(hits))
    assert out["tasks"]["swde"]["n"] == 3


def test_multiple_choice_task_scrolls_quality(offline, tmp_path, model_dir, tokenizer, monkeypatch):
    """SCROLLS QuALITY (loglikelihood over the options, lm-eval's `em`): each request the model scores is cut to
    max_context and ends as lm-eval's prompt ends (the question), and EM is 100 x the share of documents whose
    character-normalised best option is the gold one, from linlm's log-likelihoods."""
    squad_normalizer_shim()
    import lm_eval.tasks.scrolls.task as scrolls

    seen = _recording(monkeypatch)
    model = load(model_dir).eval()
    with offline_scrolls_metric():  # the hub is unreachable here: no metric script to fetch
        task = _local(scrolls.QuALITY, ["train", "validation"], ROWS / "scrolls_quality.jsonl", tmp_path / "hf",
                      after=scrolls._drop_duplicates_in_input)
    out = run_long_tasks(model, tokenizer, ["scrolls_quality"], max_context=40, task_dict={"scrolls_quality": task})
    (reqs, window), = seen
    assert window == 40
    docs = list(task.validation_docs())
    correct = 0
    for doc, req in zip(docs, reqs):  # one prefill per document: its options share the context
        full = tokenizer.encode_input(task.doc_to_text(doc))
        longest = max(len(c) for c in req.continuations)
        assert len(req.context) + longest - 1 > 40  # these prompts are longer than the window...
        from linlm.eval.scoring import truncate

        kept, was_cut = truncate(req, 40)
        assert was_cut and kept.context == full[-len(kept.context):]  # ...and keep their end: the question
        assert req.continuations == [tokenizer.encode_input(task.doc_to_text(doc) + " " + c)[len(full):]
                                     for c in doc["choices"]]
    from linlm.eval.scoring import score_requests

    scored = score_requests(model, reqs, max_length=40)
    for doc, s in zip(docs, scored):
        norm = [ll / len(c) for ll, c in zip(s.logliks, doc["choices"])]
        correct += max(range(len(norm)), key=norm.__getitem__) == doc["gold"]
    assert out["tasks"]["scrolls_quality"]["em"] == pytest.approx(100.0 * correct / len(docs))
    assert out["cut"]["cut"] == 2 and out["cut"]["window"] == 40


def test_eval_cli_runs_long_tasks_beside_linlms_own(offline, model_dir, data_dir, tmp_path, monkeypatch, capsys):
    """`--tasks piqa,scrolls`: piqa from linlm's files, the 7 SCROLLS tasks through lm-eval with --max-length as
    the cut; both in the table and the JSON."""
    import json

    import linlm.eval.long_tasks as long_tasks
    from linlm.cli import main

    calls = []

    def fake(model, tok, names, **kw):
        calls.append((list(names), kw["max_context"]))
        tasks = {t: {**{m: 50.0 for m in ms}, "n": 2} for t, ms in SCROLLS_METRICS.items()}
        return {"tasks": tasks, "cut": {"window": 32, "requests": 14, "cut": 9, "longest_input": 80},
                "max_context": 32, "scrolls_avg": scrolls_average(tasks)}

    monkeypatch.setattr(long_tasks, "run_long_tasks", fake)
    out = tmp_path / "r.json"
    assert main(["eval", "--model", str(model_dir), "--tasks", "piqa,scrolls", "--data-dir", str(data_dir),
                 "--max-length", "128", "--json", str(out), "--quiet"]) == 0
    assert calls == [(list(SCROLLS_METRICS), 128)]
    text = capsys.readouterr().out
    assert "scrolls avg (13 metrics)" in text and "9 of 14 requests cut from the left to 32 tokens" in text
    res = json.loads(out.read_text())
    assert "piqa" in res["tasks"] and res["long_tasks"]["scrolls_avg"] == 50.0


def test_ruler_niah_prompts_fit_the_length_and_score_by_string_match(offline, model_dir, tokenizer, monkeypatch):
    """RULER's niah_single_1, generated by lm-eval offline with the model's own tokenizer for 512 tokens: every
    prompt fits (nothing cut, room for 128 answer tokens), and `acc` is the share of answers holding the gold value
    (answers fixed here: the right value for every other document). A length too short is one line."""
    pytest.importorskip("wonderwords")
    from linlm.errors import ConfigError
    from linlm.eval.harness import LinlmLM

    seen = []

    def answer(self, requests, disable_tqdm=False):
        out = []
        for r in requests:
            seen.append(r.args[0])
            out.append(f" {r.doc['outputs'][0]}." if len(seen) % 2 else " I do not know.")
        return out

    monkeypatch.setattr(LinlmLM, "generate_until", answer)
    model = load(model_dir).eval()
    out = run_long_tasks(model, tokenizer, ["niah_single_1"], limit=4, max_context=512)
    assert len(seen) == 4 and all(len(tokenizer.encode_input(p)) <= 512 - 128 for p in seen)
    assert all("special magic number" in p for p in seen)
    assert out["tasks"]["niah_single_1"] == {"acc": 0.5, "length": 512, "n": 4}
    with pytest.raises(ConfigError, match="RULER cannot fit its prompt.*in 64 tokens"):
        run_long_tasks(model, tokenizer, ["niah_single_1"], limit=2, max_context=64)
    assert split_tasks(["recall"])[1][-3:] == ["niah_single_1", "niah_multikey_2", "niah_multikey_3"]
