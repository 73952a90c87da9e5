"""Zero-shot tasks: reading, requests, metrics and the evaluator, on the small fixture files."""

import json
import math

import pytest
import torch

from linlm import create_model, load
from linlm.errors import ConfigError, DataError, TokenizerError
from linlm.eval.evaluator import evaluate
from linlm.eval.scoring import Scored
from linlm.eval.tasks import (COMMONSENSE, TASKS, Doc, aggregate, doc_metrics, encode_pair, join, mean_stderr,
                              read_jsonl, request_texts, resolve_tasks, validate_record)


def test_unknown_task_lists_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        resolve_tasks("piqa,hellaswagg")
    assert "hellaswagg" in str(e.value) and "'winogrande'" in str(e.value) and "'commonsense'" in str(e.value)
    assert resolve_tasks("commonsense,piqa") == list(COMMONSENSE)


def test_malformed_line_names_file_and_line_then_skips_on_request(tmp_path):
    f = tmp_path / "piqa.jsonl"
    good = {"query": "Q", "choices": ["a", "b"], "gold": 1}
    f.write_text(json.dumps(good) + "\n\n{not json\n" + json.dumps({**good, "gold": 5}) + "\n" + json.dumps(good) + "\n")
    from linlm.eval.tasks import load_task

    with pytest.raises(DataError, match=r"piqa.jsonl:3: malformed line"):
        load_task(TASKS["piqa"], tmp_path)
    recs, skipped = load_task(TASKS["piqa"], tmp_path, skip_bad=True)
    assert len(recs) == 2
    assert [s.split(": ")[0].rsplit(":", 1)[1] for s in skipped] == ["3", "4"]
    assert "gold=5" in skipped[1]
    with pytest.raises(DataError, match="no such file"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_encode_pair_moves_trailing_space_to_the_continuation(tokenizer):
    ctx, cont = encode_pair(tokenizer, "The cat sat on the ", "mat")
    assert ctx == tokenizer.encode("The cat sat on the")
    assert ctx + cont == tokenizer.encode("The cat sat on the mat")
    assert join("Question: x\n", "a") == "a" and join("She", "runs") == " runs"
    assert encode_pair(tokenizer, "", "hello")[0] == [tokenizer.eos_id]



def test_a_records_delimiter_is_always_put_in():
    """Without ``delimiter`` the space is left out after a prompt ending in whitespace (llm-foundry's PIQA ends
    each query with a newline); with it, as in files converted from the hub, it is put in as lm-eval does."""
    piqa = {"query": "Question: x\n", "choices": ["a", "b"], "gold": 0}
    assert request_texts("choice", piqa) == [("Question: x\n", "a"), ("Question: x\n", "b")]
    assert request_texts("choice", {**piqa, "delimiter": " "}) == [("Question: x\n", " a"), ("Question: x\n", " b")]
    wino = {"context_options": ["A so B", "A so C"], "continuation": "won.", "gold": 1, "delimiter": ""}
    assert request_texts("partial", wino) == [("A so B", "won."), ("A so C", "won.")]
    assert request_texts("lambada", {"context": "he saw the ", "continuation": "dog", "delimiter": " "}) == \
        [("he saw the ", " dog")]
    with pytest.raises(ValueError, match="'delimiter' must be str"):
        validate_record("choice", {**piqa, "delimiter": 1})

def test_acc_and_acc_norm_and_stderr():
    # Choice 1 has the highest sum; per byte, choice 0 wins (-3 / 3 bytes > -4 / 2 bytes).
    doc = Doc([], gold=0, choice_bytes=[3, 2])
    m = doc_metrics("choice", doc, [Scored([-3.0, -2.5], [False, False])])
    assert m == {"acc": 0.0, "acc_norm": 1.0}
    agg = aggregate("choice", [{"acc": 1.0, "acc_norm": 1.0}, {"acc": 0.0, "acc_norm": 1.0}, {"acc": 1.0, "acc_norm": 0.0}])
    assert agg["acc"] == pytest.approx(2 / 3)
    assert agg["acc_stderr"] == pytest.approx(math.sqrt((2 * (1 / 3) ** 2 + (2 / 3) ** 2) / 2 / 3))
    assert math.isnan(mean_stderr([1.0])[1])  # no spread from a single value
    lam = aggregate("lambada", [{"acc": 1.0, "loglik": -1.0}, {"acc": 0.0, "loglik": -3.0}])
    assert lam["perplexity"] == pytest.approx(math.exp(2.0))
    assert lam["perplexity_stderr"] == pytest.approx(math.exp(2.0) * 1.0)


def _direct_loglik(model, tokenizer, context, continuation):
    """Score one choice by the definition: one full pass over the joined text."""
    ctx, cont = encode_pair(tokenizer, context, continuation)
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids)[0].double(), -1)
    n = len(ctx)
    return float(logp[n - 1:n - 1 + len(cont)].gather(-1, torch.tensor(cont)[:, None]).sum())


def test_evaluate_matches_the_definition(model_dir, tokenizer, data_dir):
    model = load(model_dir).eval()
    res = evaluate(model, tokenizer, "all", data_dir, batch_size=3)
    naive = evaluate(model, tokenizer, "all", data_dir, batch_size=2, shared=False)
    for name in TASKS:
        for k in ("acc", "acc_norm", "perplexity"):
            if k in res["tasks"][name]:
                assert res["tasks"][name][k] == pytest.approx(naive["tasks"][name][k], rel=1e-5), (name, k)
    # hellaswag and winogrande recomputed here from full passes over the joined text.
    hs = [json.loads(l) for l in (data_dir / "hellaswag.jsonl").read_text().splitlines()]
    acc = acc_norm = 0
    for r in hs:
        lls = [_direct_loglik(model, tokenizer, r["query"], " " + c) for c in r["choices"]]
        acc += max(range(4), key=lambda i: lls[i]) == r["gold"]
        acc_norm += max(range(4), key=lambda i: lls[i] / len(r["choices"][i].encode())) == r["gold"]
    assert res["tasks"]["hellaswag"]["acc"] == pytest.approx(acc / len(hs))
    assert res["tasks"]["hellaswag"]["acc_norm"] == pytest.approx(acc_norm / len(hs))
    wg = [json.loads(l) for l in (data_dir / "winogrande.jsonl").read_text().splitlines()]
    acc = sum(max(range(2), key=lambda i: _direct_loglik(model, tokenizer, r["context_options"][i],
                                                         " " + r["continuation"])) == r["gold"] for r in wg)
    assert res["tasks"]["winogrande"]["acc"] == pytest.approx(acc / len(wg))
    avg = res["commonsense_avg"]
    expect = sum(res["tasks"][t][TASKS[t].metric] for t in COMMONSENSE) / 7
    assert avg["score"] == pytest.approx(expect)
    assert res["tasks"]["lambada"]["perplexity"] > 1 and res["tasks"]["piqa"]["n"] == 5


def test_limit_and_tokenizer_mismatch(model_dir, tokenizer, data_dir):
    model = load(model_dir).eval()
    res = evaluate(model, tokenizer, ["piqa"], data_dir, limit=2)
    assert res["tasks"]["piqa"]["n"] == 2 and "commonsense_avg" not in res
    small = create_model("tnl", preset="tiny", vocab_size=128)
    with pytest.raises(TokenizerError, match="vocab_size"):
        evaluate(small, tokenizer, ["piqa"], data_dir)


def test_overlong_documents_are_an_error_or_left_out_and_counted(model_dir, tokenizer, data_dir):
    model = load(model_dir).eval()
    from linlm.eval.tasks import build_doc

    docs = [build_doc("choice", json.loads(l), tokenizer) for l in (data_dir / "piqa.jsonl").read_text().splitlines()]
    lens = sorted(max(len(c) for q in d.requests for c in q.continuations) for d in docs)
    cut = lens[len(lens) // 2]  # about half the documents have an answer longer than this
    longer = sum(n > cut for n in lens)
    assert 0 < longer < len(docs)
    with pytest.raises(Exception, match=r"does not fit the model's max length"):
        evaluate(model, tokenizer, ["piqa"], data_dir, max_length=cut)
    res = evaluate(model, tokenizer, ["piqa"], data_dir, max_length=cut, drop_overlong=True)["tasks"]["piqa"]
    assert res["dropped_docs"] == longer and res["n"] == len(docs) - longer
    full = evaluate(model, tokenizer, ["piqa"], data_dir, drop_overlong=True)["tasks"]["piqa"]
    assert full["dropped_docs"] == 0 and full["n"] == len(docs)


def test_reproduce_scores_every_model_on_the_same_inputs(tmp_path, tokenizer, data_dir, model_dir):
    """linlm reproduce's zero-shot section: the window is the shortest among the models (from their configs), and a
    linear model without a window reads exactly what the position-limited LLaMA reads."""
    from linlm.reproduce.sections.zeroshot import measure as zeroshot

    torch.manual_seed(2)
    llama = create_model("llama", preset="tiny", vocab_size=320, max_seq_len=32)
    llama_dir = tmp_path / "llama"
    llama.save(llama_dir)
    tokenizer.save(llama_dir)
    models = {"tnl": {"checkpoint": str(model_dir), "arch": "tnl", "params": 1},
              "llama": {"checkpoint": str(llama_dir), "arch": "llama", "params": 1}}
    out = zeroshot(models, str(data_dir), "piqa,hellaswag", None, lambda f: None)
    assert out["max_length"] == 32 and not out["not_scored"]
    tnl, ll = out["models"]["tnl"]["tasks"], out["models"]["llama"]["tasks"]
    assert tnl["piqa"]["dropped_docs"] > 0  # the window binds: a fixture piqa document is longer than 32 tokens
    for task in ("piqa", "hellaswag"):
        assert (tnl[task]["n"], tnl[task]["dropped_docs"]) == (ll[task]["n"], ll[task]["dropped_docs"])
        alone = evaluate(load(model_dir).eval(), tokenizer, [task], data_dir, max_length=32, drop_overlong=True)
        assert [tnl[task][k] for k in ("n", "dropped_docs", "acc")] == \
            [alone["tasks"][task][k] for k in ("n", "dropped_docs", "acc")]
