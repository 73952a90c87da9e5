"""The lm-evaluation-harness adapter, offline: custom tasks read from the local JSON Lines fixtures give the same
acc and acc_norm through lm-eval as through linlm's own evaluator."""

import json
import math

import pytest

lm_eval = pytest.importorskip("lm_eval")

from linlm import load  # noqa: E402
from linlm.eval.evaluator import evaluate  # noqa: E402
from linlm.eval.harness import LinlmLM  # noqa: E402

TASK_HEAD = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {file}
test_split: test
output_type: multiple_choice
"""
CHOICE_TASK = TASK_HEAD + """doc_to_text: "{{{{query}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
  - metric: acc_bytes
"""
PARTIAL_TASK = TASK_HEAD + """doc_to_text: !function fixture_utils.gold
doc_to_choice: "{{{{context_options}}}}"
doc_to_target: "{{{{continuation}}}}"
metric_list:
  - metric: acc
"""

UTILS = "def gold(doc):\n    return doc['gold']\n"


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def test_lm_eval_gives_the_same_acc_and_acc_norm(offline, tmp_path, model_dir, tokenizer, data_dir):
    from lm_eval.tasks import TaskManager

    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    names = {"hellaswag": "linlm_fx_hellaswag", "arc_easy": "linlm_fx_arc_easy", "winogrande": "linlm_fx_winogrande"}
    for ours, theirs in names.items():
        from linlm.eval.tasks import TASKS

        body = PARTIAL_TASK if ours == "winogrande" else CHOICE_TASK
        (tasks_dir / f"{theirs}.yaml").write_text(body.format(name=theirs, file=data_dir / TASKS[ours].filename))
    (tasks_dir / "fixture_utils.py").write_text(UTILS)
    lm = LinlmLM(pretrained=str(model_dir), batch_size=3)
    out = lm_eval.simple_evaluate(model=lm, tasks=list(names.values()), task_manager=TaskManager(include_path=str(tasks_dir)),
                                  num_fewshot=0, bootstrap_iters=100, log_samples=False)
    theirs = out["results"]
    model = load(model_dir)
    ours = evaluate(model, tokenizer, list(names), data_dir)["tasks"]
    for task, name in names.items():
        assert theirs[name]["acc,none"] == pytest.approx(ours[task]["acc"], abs=1e-12), task
        assert theirs[name]["acc_stderr,none"] == pytest.approx(ours[task]["acc_stderr"], abs=1e-12), task
        if task != "winogrande":
            # Our acc_norm divides by bytes (the paper's); lm-eval's acc_norm by characters, acc_bytes by bytes.
            assert theirs[name]["acc_norm,none"] == pytest.approx(ours[task]["acc_norm"], abs=1e-12), task
            assert theirs[name]["acc_bytes,none"] == pytest.approx(ours[task]["acc_norm"], abs=1e-12), task


def test_adapter_requests(offline, model_dir, tokenizer):
    from lm_eval.api.instance import Instance

    from linlm.eval.perplexity import perplexity
    from linlm.eval.scoring import Request, score_requests

    lm = LinlmLM(pretrained=str(model_dir))
    ctx, a, b = "The old dog slept by the", " fire", " moon"
    reqs = [Instance("loglikelihood", {}, (ctx, c), i) for i, c in enumerate([a, b])]
    got = lm.loglikelihood(reqs)
    ref = score_requests(lm.model, [Request(tokenizer.encode(ctx), [tokenizer.encode(ctx + c)[len(tokenizer.encode(ctx)):]
                                                                    for c in (a, b)])])[0]
    assert [g[0] for g in got] == pytest.approx(ref.logliks, abs=1e-6)
    text = "He counted the coins twice. There were ten of them."
    roll = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert roll[0] == pytest.approx(-perplexity(lm.model, tokenizer, [text]).nll, rel=1e-6) and roll[0] < 0
    gen = lm.generate_until([Instance("generate_until", {}, (ctx, {"until": ["\n"], "max_gen_toks": 5}), 0)])
    assert isinstance(gen[0], str) and "\n" not in gen[0] and len(tokenizer.encode(gen[0])) <= 5


def test_simple_evaluate_by_name(offline, tmp_path, model_dir, data_dir):
    """model="linlm" with model_args, as the lm_eval command line does."""
    from lm_eval.tasks import TaskManager

    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    (tasks_dir / "fx_piqa.yaml").write_text(CHOICE_TASK.format(name="linlm_fx_piqa", file=data_dir / "piqa.jsonl"))
    out = lm_eval.simple_evaluate(model="linlm", model_args=f"pretrained={model_dir}", tasks=["linlm_fx_piqa"],
                                  task_manager=TaskManager(include_path=str(tasks_dir)), bootstrap_iters=0)
    acc = out["results"]["linlm_fx_piqa"]["acc,none"]
    assert 0 <= acc <= 1 and not math.isnan(acc)
