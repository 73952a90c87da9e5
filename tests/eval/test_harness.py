"""The lm-evaluation-harness adapter, offline: custom tasks read from the local JSON Lines fixtures give the same
acc and acc_norm through lm-eval as through linlm's own evaluator."""

import json
import math
from pathlib import Path

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


def _python_with_site(site_dir, code: str, *args: str, env=None):
    """A fresh interpreter that processes ``site_dir`` as a site-packages directory (its .pth files run), as
    Python does for the environment's own site-packages at start-up."""
    import subprocess
    import sys

    prelude = f"import site, sys; site.addsitedir({str(site_dir)!r}); "
    return subprocess.run([sys.executable, "-c", prelude + code, *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_hook_registers_linlm_lazily(tmp_path):
    from linlm.eval import lm_eval_hook as hook

    site_dir = tmp_path / "site"
    site_dir.mkdir()
    assert not hook.installed(str(site_dir))
    path = hook.install(str(site_dir))
    assert hook.installed(str(site_dir)) and path.endswith(hook.PTH_NAME)
    probe = ("before = sorted(m for m in ('linlm', 'torch', 'lm_eval') if m in sys.modules); "
             "import lm_eval.models; from lm_eval.api.registry import model_registry as r; "
             "lazy = r._objs['linlm']; after = 'linlm' in sys.modules; "
             "from lm_eval.api.registry import get_model; cls = get_model('linlm'); "
             "print(before, lazy, after, cls.__module__ + '.' + cls.__name__)")
    out = _python_with_site(site_dir, probe)
    assert out.returncode == 0, out.stderr
    # Nothing imported at start-up; a placeholder after lm_eval.models; the class only when asked for.
    assert out.stdout.split() == ["[]", hook.MODEL_PATH, "False", "linlm.eval.harness.LinlmLM"]
    without = _python_with_site(tmp_path, "import lm_eval.models; from lm_eval.api.registry import model_registry "
                                          "as r; print('linlm' in r)")
    assert without.stdout.strip() == "False"  # the finder is what adds it


def test_lm_eval_command_with_the_hook(offline, tmp_path, model_dir, tokenizer, data_dir):
    """`lm_eval --model linlm ...` (lm-eval's own command line) on a custom task gives linlm's acc."""
    import os

    from linlm.eval import lm_eval_hook as hook

    site_dir = tmp_path / "site"
    site_dir.mkdir()
    hook.install(str(site_dir))
    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    (tasks_dir / "fx_piqa.yaml").write_text(CHOICE_TASK.format(name="linlm_fx_piqa", file=data_dir / "piqa.jsonl"))
    out_dir = tmp_path / "out"
    run = _python_with_site(site_dir, "sys.argv[0] = 'lm_eval'; from lm_eval.__main__ import cli_evaluate; "
                                      "sys.exit(cli_evaluate())",
                            "--model", "linlm", "--model_args", f"pretrained={model_dir}", "--tasks", "linlm_fx_piqa",
                            "--include_path", str(tasks_dir), "--output_path", str(out_dir), env=dict(os.environ))
    assert run.returncode == 0, run.stderr[-3000:]
    files = sorted(out_dir.rglob("results*.json"))
    assert len(files) == 1
    theirs = json.loads(files[0].read_text())["results"]["linlm_fx_piqa"]
    ours = evaluate(load(model_dir), tokenizer, ["piqa"], data_dir)["tasks"]["piqa"]
    assert theirs["acc,none"] == pytest.approx(ours["acc"], abs=1e-12)
    assert theirs["acc_bytes,none"] == pytest.approx(ours["acc_norm"], abs=1e-12)


def test_hook_file_rules(tmp_path, capsys):
    from linlm.errors import StorageError
    from linlm.eval import lm_eval_hook as hook

    site_dir = str(tmp_path)
    assert hook.remove(site_dir) is None
    foreign = tmp_path / hook.PTH_NAME
    foreign.write_text("import something_else\n")
    with pytest.raises(StorageError, match="not written by linlm"):
        hook.install(site_dir)
    with pytest.raises(StorageError, match="not written by linlm"):
        hook.remove(site_dir)
    assert foreign.read_text() == "import something_else\n"  # left as it was
    foreign.unlink()
    hook.install(site_dir)
    hook.install(site_dir)  # its own file is replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == [hook.PTH_NAME]
    assert hook.remove(site_dir) == str(foreign) and not foreign.exists()
    # The line of a hook whose file is gone (linlm uninstalled) does nothing and prints nothing.
    foreign.write_text(hook.pth_text(str(tmp_path / "gone" / "lm_eval_hook.py")))
    out = _python_with_site(tmp_path, "print(len(sys.meta_path))")
    base = _python_with_site(tmp_path / "nowhere", "print(len(sys.meta_path))")
    assert out.returncode == 0 and out.stderr == "" and out.stdout == base.stdout


def _entry_point_runs(cases: list[list[str]], env: dict) -> list[tuple[int, str]]:
    """Run the installed console script ``linlm-lm-eval`` (its entry point, loaded as the script loads it) on each
    argument list, in one fresh interpreter (lm-eval's start-up is the slow part); (exit status, stderr) each."""
    import subprocess
    import sys

    code = ("import json, sys; from importlib.metadata import entry_points; "
            "(ep,) = entry_points(group='console_scripts', name='linlm-lm-eval'); main = ep.load(); "
            "sys.argv[0] = 'linlm-lm-eval'; codes = []\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    sys.argv[1:] = argv; codes.append(main()); print('=== case end', file=sys.stderr, flush=True)\n"
            "print(json.dumps(codes))")
    run = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return list(zip(json.loads(run.stdout.splitlines()[-1]), run.stderr.split("=== case end\n")))


def test_linlm_lm_eval_prints_linlms_errors_in_one_line(offline, tmp_path, tokenizer):
    """A missing pretrained= path and a corrupt checkpoint: one `linlm-lm-eval: error:` line, no traceback, exit 2
    (lm-eval's own log lines may come before it)."""
    import os

    from linlm import create_model
    from output_asserts import one_line_error

    corrupt = tmp_path / "corrupt"
    create_model("tnl", preset="tiny", vocab_size=320).save(corrupt)
    tokenizer.save(corrupt)
    weights = corrupt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                                       os.environ.get("PYTHONPATH", "")]))
    cases = [["--model", "linlm", "--model_args", f"pretrained={tmp_path / 'missing'}", "--tasks", "piqa"],
             ["--model", "linlm", "--model_args", f"pretrained={corrupt}", "--tasks", "piqa"]]
    (rc_missing, err_missing), (rc_corrupt, err_corrupt) = _entry_point_runs(cases, env)
    assert rc_missing == 2 and rc_corrupt == 2
    for err, named in ((err_missing, f"{tmp_path / 'missing'}: does not exist"),
                       (err_corrupt, "model.safetensors: checksum mismatch")):
        lines = err.strip().splitlines()
        assert sum("error:" in line for line in lines) == 1, err
        one_line_error(lines[-1], named, prog="linlm-lm-eval")  # lm-eval's INFO log lines come before it
        assert "Traceback" not in err, err


@pytest.mark.parametrize("args, match", [(dict(max_length=0), "max_length=0"), (dict(batch_size=0), "batch_size=0"),
                                         (dict(batch_size="x"), "batch_size='x'")])
def test_model_args_counts_are_whole_numbers_never_zero(args, match, model_dir):
    """max_length=0 used to mean "the model's own limit"; a 0 (or a word) is now refused in one line."""
    from linlm.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        LinlmLM(pretrained=str(model_dir), **args)
    assert LinlmLM(pretrained=str(model_dir), batch_size="auto", max_length=None).batch_size == 16


def _lm_eval_wikitext(tmp_path):
    """lm-eval's own ``wikitext`` task object (its installed YAML, detokenizer and process_results) reading the
    local copy of WikiText-2's document-level rows (tests/eval/data/hub/wikitext2.jsonl) for every split."""
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    rows = Path(__file__).parent / "data" / "hub" / "wikitext2.jsonl"
    cfg = load_yaml(Path(lm_eval.__file__).parent / "tasks" / "wikitext" / "wikitext.yaml")
    cfg.update(dataset_path="json", dataset_name=None,
               dataset_kwargs={"data_files": {s: str(rows) for s in ("train", "validation", "test")},
                               "cache_dir": str(tmp_path / "hf-json")})
    return ConfigurableTask(config=cfg)


def _their_wikitext(lm, tmp_path) -> dict:
    from lm_eval.evaluator import evaluate as lm_eval_evaluate

    out = lm_eval_evaluate(lm=lm, task_dict={"wikitext": _lm_eval_wikitext(tmp_path)}, bootstrap_iters=0)
    return {k: out["results"]["wikitext"][k + ",none"] for k in ("word_perplexity", "byte_perplexity",
                                                                  "bits_per_byte")}


def test_wikitext2_equals_lm_evals_wikitext_task(offline, tmp_path, model_dir, tokenizer):
    """`linlm perplexity --source wikitext2` (the hub rows converted by `linlm eval fetch`) gives lm-eval's own
    wikitext task's word perplexity, byte perplexity and bits per byte through the adapter, to 1e-4; and so does a
    LLaMA whose window is shorter than the documents (lm-eval's rolling windows)."""
    import torch

    from linlm import create_model
    from linlm.cli import main
    from linlm.eval import hub

    loader = hub.files_loader({"wikitext2": Path(__file__).parent / "data" / "hub" / "wikitext2.jsonl"},
                              tmp_path / "hf-ours")
    tasks = tmp_path / "tasks"
    hub.fetch("wikitext2", tasks, loader=loader)
    out = tmp_path / "wt2.json"
    assert main(["perplexity", "--model", str(model_dir), "--source", "wikitext2", "--data-dir", str(tasks),
                 "--json", str(out)]) == 0
    ours = json.loads(out.read_text())
    theirs = _their_wikitext(LinlmLM(pretrained=str(model_dir), batch_size=2), tmp_path)
    for k, v in theirs.items():
        assert ours[k] == pytest.approx(v, rel=1e-4), k
    assert ours["n"] == 3 and ours["word_perplexity"] > 1
    torch.manual_seed(3)
    llama = create_model("llama", preset="tiny", vocab_size=320, max_seq_len=48).eval()
    theirs = _their_wikitext(LinlmLM(model=llama, tokenizer=tokenizer), tmp_path)
    mine = evaluate(llama, tokenizer, ["wikitext2"], tasks)["tasks"]["wikitext2"]
    assert mine["max_length"] == 48
    for k, v in theirs.items():
        assert mine[k] == pytest.approx(v, rel=1e-4), k
    # The flags of a text source are refused with this one, in one line.
    assert main(["perplexity", "--model", str(model_dir), "--source", "wikitext2", "--data-dir", str(tasks),
                 "--window", "64"]) == 2
