"""The standard tasks from the dataset hub (linlm.eval.hub), without the network: small copies in the hub's
formats (tests/eval/data/hub: JSON Lines, and Parquet written from them here) read through `datasets`' local
loading. Their requests are compared with those of lm-evaluation-harness' own task objects, built from its
installed task YAMLs on the same rows."""

import json
from pathlib import Path

import pytest
from output_asserts import forbid, one_line_error, snapshot

from linlm import outputs
from linlm.cli import main
from linlm.errors import DataError, OutputError
from linlm.eval import hub
from linlm.eval.tasks import TASKS, load_task, request_texts

HUB_DATA = Path(__file__).parent / "data" / "hub"
# Each task's YAML under lm_eval/tasks.
LM_EVAL_YAML = {"piqa": "piqa/piqa.yaml", "hellaswag": "hellaswag/hellaswag.yaml", "arc_easy": "arc/arc_easy.yaml",
                "arc_challenge": "arc/arc_challenge.yaml", "openbookqa": "openbookqa/openbookqa.yaml",
                "boolq": "super_glue/boolq/default.yaml", "winogrande": "winogrande/default.yaml",
                "lambada": "lambada/lambada_openai.yaml", "wikitext2": "wikitext/wikitext.yaml"}


def hub_rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (HUB_DATA / f"{name}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def jsonl_loader(tmp_path_factory):
    return hub.files_loader({n: HUB_DATA / f"{n}.jsonl" for n in hub.HUB}, tmp_path_factory.mktemp("hf-cache"))


@pytest.fixture(scope="module")
def parquet_loader(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("hub-parquet")
    for name in hub.HUB:
        pq.write_table(pa.Table.from_pylist(hub_rows(name)), root / f"{name}.parquet")
    return hub.files_loader({n: root / f"{n}.parquet" for n in hub.HUB}, tmp_path_factory.mktemp("hf-cache"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LINLM_CACHE_DIR", str(tmp_path / "cache"))
    for k in hub.OFFLINE_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("LINLM_EVAL_DATA", raising=False)
    return tmp_path / "cache"


def lm_eval_task(name: str, hf_cache: Path):
    """lm-eval's task object for ``name``, from its installed YAML, reading the JSON Lines copy for the split it
    evaluates (its dataset path, name and split are first checked against linlm's)."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    cfg = load_yaml(Path(lm_eval.__file__).parent / "tasks" / LM_EVAL_YAML[name])
    split = cfg.get("test_split") or cfg.get("validation_split")
    assert (cfg["dataset_path"], cfg.get("dataset_name"), split) == \
        (hub.HUB[name].path, hub.HUB[name].name, hub.HUB[name].split)
    # Every split the YAML names reads the copy (the others only feed few-shot examples, none here).
    splits = {cfg.get(k) for k in ("training_split", "validation_split", "test_split")} - {None}
    cfg.update(dataset_path="json", dataset_name=None,
               dataset_kwargs={"data_files": {s: str(HUB_DATA / f"{name}.jsonl") for s in splits},
                               "cache_dir": str(hf_cache)})
    return ConfigurableTask(config=cfg)


def test_every_task_has_a_hub_source():
    assert set(hub.HUB) == set(TASKS)


@pytest.mark.parametrize("name", list(LM_EVAL_YAML))
def test_requests_equal_lm_eval_tasks(name, parquet_loader, tmp_path):
    """Per document, the (context, continuation) strings and the gold index equal lm-eval's: its process_docs,
    doc_to_text, doc_to_choice, doc_to_target and target delimiter, applied by its own task object."""
    task = lm_eval_task(name, tmp_path)
    kind = TASKS[name].kind
    records = hub.load_records(name, parquet_loader)
    docs = list(task.eval_docs)
    assert len(records) == len(docs) == len(hub_rows(name))
    for doc, rec in zip(docs, records):
        reqs = task.construct_requests(doc, task.fewshot_context(doc, 0), metadata=(name, 0, 1))
        theirs = [r.arguments for r in (reqs if isinstance(reqs, list) else [reqs])]
        assert request_texts(kind, rec) == theirs
        if kind not in ("lambada", "rolling"):
            assert rec["gold"] == (task.doc_to_text(doc) if task.multiple_input else task.doc_to_target(doc))


def test_parquet_and_json_lines_copies_convert_alike(jsonl_loader, parquet_loader):
    for name in hub.HUB:
        assert hub.load_records(name, jsonl_loader) == hub.load_records(name, parquet_loader)


def test_fetch_writes_files_eval_reads(cache, tmp_path, jsonl_loader):
    out = tmp_path / "tasks"
    seen = []
    paths = hub.fetch("piqa,winogrande,lambada", out, loader=jsonl_loader, progress=lambda *a: seen.append(a))
    assert list(paths) == ["piqa", "winogrande", "lambada"]
    for name, path in paths.items():
        assert path == out / TASKS[name].filename and outputs.owns_file(path)
        records, skipped = load_task(TASKS[name], out)
        assert records == hub.load_records(name, jsonl_loader) and not skipped
    assert [(n, d) for n, _, d in seen] == [(n, len(hub_rows(n))) for n in paths]
    assert not cache.exists()  # fetch writes --out only


def test_fetch_refuses_a_users_file_and_writes_nothing(cache, tmp_path, jsonl_loader):
    out = tmp_path / "tasks"
    out.mkdir()
    (out / "piqa.jsonl").write_text("mine\n")
    before = snapshot(out)
    with pytest.raises(OutputError, match="linlm did not write"):
        hub.fetch("piqa", out, loader=jsonl_loader)
    assert snapshot(out) == before


def test_task_dir_fills_the_cache_once(cache, jsonl_loader):
    root = hub.task_dir("piqa,boolq", loader=jsonl_loader)
    assert root == cache / "tasks" / hub.FORMAT
    assert sorted(p.name for p in root.glob("*.jsonl")) == ["boolq.jsonl", "piqa.jsonl"]

    def no_hub(task):
        raise AssertionError(f"asked the hub for {task.path} although it is cached")

    assert hub.task_dir("boolq,piqa", loader=no_hub) == root
    # fetch copies a cached task instead of asking the hub again.
    paths = hub.fetch("piqa", cache.parent / "copy", loader=no_hub)
    assert paths["piqa"].read_bytes() == (root / "piqa.jsonl").read_bytes()


def test_an_explicit_data_dir_is_used_as_it_is(cache, data_dir):
    assert hub.task_dir("piqa", data_dir) == data_dir
    with pytest.raises(DataError, match="not a directory; pass --data-dir"):
        hub.task_dir("piqa", data_dir / "nope")


@pytest.mark.parametrize("var", hub.OFFLINE_ENV)
def test_offline_and_not_cached_is_one_line_without_asking_the_hub(var, cache, model_dir, monkeypatch, capsys):
    """With an offline variable set, neither the hub nor datasets is asked (no retries, no wait) and the model is
    not loaded; the one line names --data-dir and the fetch command."""
    monkeypatch.setenv(var, "1")
    pytest.importorskip("datasets")
    forbid(monkeypatch, "datasets.load_dataset", "linlm.infer.generate.load_for_generation",
           why="offline, nothing may be loaded")
    assert main(["eval", "--model", str(model_dir), "--tasks", "piqa,hellaswag", "--quiet"]) == 2
    one_line_error(capsys.readouterr().err, "piqa, hellaswag: not in the task cache", var, "--data-dir",
                   "linlm eval fetch --tasks piqa,hellaswag --out DIR")
    assert main(["eval", "fetch", "--tasks", "lambada", "--out", str(cache.parent / "out")]) == 2
    one_line_error(capsys.readouterr().err, "lambada: not in the task cache", "where the dataset hub can be reached")
    with pytest.raises(ConnectionError, match="offline"):
        hub.hub_loader(hub.HUB["piqa"])
    assert not cache.exists() and not (cache.parent / "out").exists()


def test_hub_failures_are_one_line(cache):
    def unreachable(task):
        raise ConnectionError("Couldn't reach 'x' on the Hub (LocalEntryNotFoundError)")

    def missing(task):
        raise FileNotFoundError(f"Dataset '{task.path}' doesn't exist on the Hub")

    with pytest.raises(DataError, match=r"piqa: not cached and baber/piqa \(validation\) could not be read: the "
                                        r"dataset hub is not reachable .*; pass --data-dir DIR") as e:
        hub.task_dir("piqa", loader=unreachable)
    assert "\n" not in str(e.value) and "linlm eval fetch --tasks piqa --out DIR" in str(e.value)
    with pytest.raises(DataError, match=r"winogrande_xl \(validation\) could not be read: loading it failed "
                                        r"\(FileNotFoundError"):
        hub.task_dir("winogrande", loader=missing)
    assert not list(cache.rglob("*.jsonl"))


def test_a_row_of_another_shape_is_named(cache):
    with pytest.raises(DataError, match=r"piqa: row 2 of baber/piqa \(validation\) does not convert \(KeyError"):
        hub.task_dir("piqa", loader=lambda task: [hub_rows("piqa")[0], {"question": "?"}])
    with pytest.raises(DataError, match="holds no rows"):
        hub.task_dir("piqa", loader=lambda task: [])


def test_eval_cli_without_data_dir_reads_the_cache(cache, model_dir, jsonl_loader, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hub, "hub_loader", jsonl_loader)
    out = tmp_path / "res.json"
    assert main(["eval", "--model", str(model_dir), "--tasks", "piqa,winogrande", "--quiet", "--json", str(out)]) == 0
    res = json.loads(out.read_text())["tasks"]
    root = cache / "tasks" / hub.FORMAT
    assert res["piqa"]["file"] == str(root / "piqa.jsonl") and res["piqa"]["n"] == len(hub_rows("piqa"))
    assert res["winogrande"]["n"] == len(hub_rows("winogrande"))
    assert "piqa: 3 documents ->" in capsys.readouterr().err


def test_eval_fetch_cli_then_data_dir(cache, model_dir, jsonl_loader, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hub, "hub_loader", jsonl_loader)
    out = tmp_path / "tasks"
    assert main(["eval", "fetch", "--tasks", "boolq,lambada", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"boolq: 2 documents -> {out / 'boolq.jsonl'}" in printed and f"--data-dir {out}" in printed
    assert main(["eval", "--model", str(model_dir), "--tasks", "boolq,lambada", "--data-dir", str(out),
                 "--quiet"]) == 0
    assert not cache.exists()


def test_eval_without_model_or_tasks_is_one_line(capsys, tmp_path):
    assert main(["eval", "--tasks", "piqa"]) == 2
    one_line_error(capsys.readouterr().err, "--model: required", "linlm eval fetch")
    assert main(["eval", "--model", str(tmp_path)]) == 2
    one_line_error(capsys.readouterr().err, "--tasks: required")
