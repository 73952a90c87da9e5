"""Every command that reads text, with a model whose directory carries a transformers tokenizer (as a converted
checkpoint does): the pretrained tokenizer is the one used, its BOS goes where lm-eval's HF wrapper puts it, and
the same weights with linlm's own tokenizer give other results."""

import json

import pytest
import torch
from output_asserts import one_line_error

from linlm import load
from linlm.cli import main
from linlm.data.tokenizer import Tokenizer

TEXTS = ["Question: How do I keep bread fresh for longer? Store it in a sealed bag in a cool place.",
         "The old dog slept by the fire while the rain fell on the roof."]


@pytest.fixture(scope="module")
def tok(pretrained_model_dir):
    return Tokenizer.from_pretrained(pretrained_model_dir)


def _spy(monkeypatch, module, name: str) -> list:
    """Record the positional arguments of every call to ``module.name`` (then make the call)."""
    calls = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def _loglik(model, context: list[int], continuation: list[int]) -> float:
    """log p(continuation | context), from one plain forward pass."""
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[:, :-1]).float(), dim=-1)[0]
    return sum(float(logp[len(context) - 1 + i, t]) for i, t in enumerate(continuation))


def _sources(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return src


def test_generate_prompts_with_the_bos(pretrained_model_dir, tok, capsys, monkeypatch):
    import linlm.models.generation as generation

    calls = _spy(monkeypatch, generation, "stream_ids")
    prompt = "Question: How do I keep bread"
    assert main(["generate", "--model", str(pretrained_model_dir), "--prompt", prompt, "--max-new-tokens", "6",
                 "--temperature", "0"]) == 0
    ids = [tok.bos_id, *tok.encode(prompt)]
    assert [list(c[1]) for c in calls] == [ids]
    new = [t for t in generation.generate_ids(load(pretrained_model_dir), ids, 6, temperature=0.0, top_k=0,
                                              eos_id=tok.eos_id) if t != tok.eos_id]
    assert capsys.readouterr().out == prompt + tok.decode(new) + "\n"


def test_eval_scores_the_pretrained_encoding(pretrained_model_dir, model_dir, tok, data_dir, tmp_path, monkeypatch):
    import linlm.eval.evaluator as evaluator
    from linlm.eval.tasks import TASKS, build_doc, load_task

    calls = _spy(monkeypatch, evaluator, "score_requests")
    results = {}
    for name, directory in (("pretrained", pretrained_model_dir), ("linlm", model_dir)):
        out = tmp_path / f"{name}.json"
        assert main(["eval", "--model", str(directory), "--tasks", "piqa,lambada", "--data-dir",
                     str(data_dir), "--limit", "3", "--json", str(out), "--quiet"]) == 0
        results[name] = json.loads(out.read_text())["tasks"]
    seen = [(r.context, r.continuations) for r in calls[0][1]] + [(r.context, r.continuations) for r in calls[1][1]]
    want = [(r.context, r.continuations) for task in ("piqa", "lambada")
            for rec in load_task(TASKS[task], data_dir, limit=3)[0]
            for r in build_doc(TASKS[task].kind, rec, tok).requests]
    assert seen == want and all(ctx[0] == tok.bos_id for ctx, _ in seen)
    assert results["pretrained"]["lambada"]["perplexity"] != results["linlm"]["lambada"]["perplexity"]


def test_perplexity_reads_documents_after_the_bos(pretrained_model_dir, model_dir, tok, tmp_path):
    src = _sources(tmp_path)
    res = {}
    for name, directory in (("pretrained", pretrained_model_dir), ("linlm", model_dir)):
        out = tmp_path / f"{name}.json"
        assert main(["perplexity", "--model", str(directory), "--source", str(src), "--json", str(out)]) == 0
        res[name] = json.loads(out.read_text())
    model = load(pretrained_model_dir)
    assert res["pretrained"]["tokens"] == sum(len(tok.encode(t)) for t in TEXTS) != res["linlm"]["tokens"]
    nll = -sum(_loglik(model, [tok.bos_id], tok.encode(t)) for t in TEXTS)
    assert res["pretrained"]["nll"] == pytest.approx(nll, rel=1e-5)


def test_niah_contexts_start_with_the_bos(pretrained_model_dir, tok, tmp_path, monkeypatch):
    import linlm.eval.niah as niah

    calls = _spy(monkeypatch, niah, "score_requests")
    src = tmp_path / "hay.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 4))
    out = tmp_path / "niah.json"
    assert main(["niah", "--model", str(pretrained_model_dir), "--haystack", str(src), "--lengths", "60,90",
                 "--depths", "0,100", "--json", str(out)]) == 0
    reqs = calls[0][1]
    assert sorted(len(r.context) for r in reqs) == [60, 60, 90, 90]
    haystack = tok.encode(TEXTS[0])
    for r in reqs:
        assert r.context[0] == tok.bos_id and tok.bos_id not in r.context[1:]
        number = tok.decode(r.continuations[0]).strip()
        assert r.continuations == [tok.encode(" " + number)]
    assert any(r.context[1:11] == haystack[:10] for r in reqs)  # depth 100: the haystack right after the BOS
    assert json.loads(out.read_text())["lengths"] == [60, 90]


def test_too_large_a_vocabulary_is_one_line(pretrained_model_dir, tok, tmp_path, capsys):
    import shutil

    from linlm import create_model

    small = tmp_path / "small"
    create_model("tnl", preset="tiny", vocab_size=64).save(small)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(pretrained_model_dir / name, small / name)
    assert tok.vocab_size > 64
    assert main(["generate", "--model", str(small), "--prompt", "the", "--max-new-tokens", "2"]) == 2
    one_line_error(capsys.readouterr().err, f"the tokenizer has {tok.vocab_size} token ids but the model's "
                   "vocab_size is 64")


# ---- the lm-eval adapter against lm-eval's HF wrapper ---------------------------------------------------------

@pytest.fixture(scope="module")
def hf_wrapper(pretrained_model_dir):
    """lm-eval's HFLM with only its tokenizer (no transformers model): its own encoding of requests, with
    add_bos_token unset (its default)."""
    transformers = pytest.importorskip("transformers")
    huggingface = pytest.importorskip("lm_eval.models.huggingface")
    lm = huggingface.HFLM.__new__(huggingface.HFLM)
    lm.tokenizer = transformers.AutoTokenizer.from_pretrained(str(pretrained_model_dir), local_files_only=True)
    lm.add_bos_token, lm.custom_prefix_token_id, lm.backend = None, None, "causal"
    return lm


def test_adapter_loglikelihoods_match_lm_eval_hf_encoding(pretrained_model_dir, tok, hf_wrapper):
    from lm_eval.api.instance import Instance

    from linlm.eval.harness import LinlmLM

    lm = LinlmLM(pretrained=str(pretrained_model_dir))
    assert lm.eot_token_id == hf_wrapper.eot_token_id == tok.eos_id
    pairs = [("Question: How do I keep bread fresh?\n", "Answer: store it"), ("The old dog slept by the ", "fire"),
             ("", "The rain fell")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)])
    for (context, continuation), (ll, _) in zip(pairs, got):
        if context:
            ctx, cont = hf_wrapper._encode_pair(context, continuation)
        else:  # lm-eval's empty context: the prefix token
            ctx, cont = [hf_wrapper.prefix_token_id], hf_wrapper.tok_encode(continuation, add_special_tokens=False)
        assert ctx[0] == tok.bos_id
        assert ll == pytest.approx(_loglik(lm.model, ctx, cont), abs=1e-4)
    text = TEXTS[1]
    roll = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])[0]
    from lm_eval import utils

    windows = list(utils.get_rolling_token_windows(token_list=hf_wrapper.tok_encode(text),
                                                   prefix_token=hf_wrapper.prefix_token_id, max_seq_len=4096,
                                                   context_len=1))
    assert len(windows) == 1 and windows[0][0][:2] == [tok.bos_id, tok.bos_id]
    assert roll == pytest.approx(_loglik(lm.model, windows[0][0][:1], windows[0][1]), abs=1e-4)
