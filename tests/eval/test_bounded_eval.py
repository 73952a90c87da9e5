"""Evaluation commands on a machine without network, two commands writing one --json file, and a token limit that
is a total."""

from __future__ import annotations

import socket
import time

import pytest
from output_asserts import forbid, one_line_error

from linlm.cli import main
from linlm.eval import hub


@pytest.fixture
def no_network(monkeypatch):
    """The hub's address does not resolve (as on these machines), at once; no offline variable is set."""
    for k in hub.OFFLINE_ENV + ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr("linlm.data.hub_probe._probed", {}, raising=False)

    def refuse(address, timeout=None, *args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", refuse)
    pytest.importorskip("datasets")
    forbid(monkeypatch, "datasets.load_dataset", why="the hub is known to be unreachable: datasets would retry for 30 s")


def test_eval_fetch_without_network_fails_at_once_naming_the_route(no_network, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LINLM_CACHE_DIR", str(tmp_path / "cache"))
    started = time.perf_counter()
    assert main(["eval", "fetch", "--tasks", "piqa", "--out", str(tmp_path / "out")]) == 2
    assert time.perf_counter() - started < 5
    one_line_error(capsys.readouterr().err, "the dataset hub is not reachable (no connection to huggingface.co:443",
                   "linlm eval fetch --tasks piqa --out DIR")
    assert not (tmp_path / "out").exists()


def test_perplexity_of_a_hub_source_without_network_fails_before_the_model_loads(no_network, model_dir, monkeypatch,
                                                                                 capsys):
    forbid(monkeypatch, "linlm.infer.generate.load_for_generation", why="an unreachable source is refused first")
    started = time.perf_counter()
    assert main(["perplexity", "--model", str(model_dir), "--source", "hf:wikitext:wikitext-2-raw-v1@test"]) == 2
    assert time.perf_counter() - started < 5
    one_line_error(capsys.readouterr().err, "the dataset hub cannot be reached (no connection to huggingface.co:443",
                   "linlm eval fetch", "HF_DATASETS_OFFLINE=1")


def test_a_second_command_writing_the_same_json_is_refused(model_dir, data_dir, tmp_path, monkeypatch, capsys):
    """Two `linlm eval --json same.json` at once: the second is refused while the first holds the file (one of the
    two results would otherwise be lost); once the first is done, the file is the second's to write."""
    import multiprocessing

    from linlm.locking import FileLock

    monkeypatch.setenv("LINLM_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "same.json"
    argv = ["eval", "--model", str(model_dir), "--data-dir", str(data_dir), "--tasks", "piqa", "--limit", "2",
            "--quiet", "--json", str(out)]
    ctx = multiprocessing.get_context("fork")
    held, release = ctx.Event(), ctx.Event()

    def first():  # the first command, between its checks and its write
        with FileLock(out, "--json", tmp_path / "cache"):
            held.set()
            release.wait(60)

    proc = ctx.Process(target=first)
    proc.start()
    try:
        assert held.wait(30)
        forbid(monkeypatch, "linlm.eval.evaluator.evaluate", why="a refused command scores nothing")
        assert main(argv) == 2
        one_line_error(capsys.readouterr().err, f"--json {out} is being written by PID {proc.pid}")
        assert not out.exists()
    finally:
        release.set()
        proc.join(30)
    monkeypatch.undo()
    monkeypatch.setenv("LINLM_CACHE_DIR", str(tmp_path / "cache"))
    assert main(argv) == 0 and out.is_file()


def test_max_tokens_is_a_total_over_the_documents(model_dir, tmp_path, capsys):
    import json

    text = tmp_path / "one.txt"  # one long document: the limit used to stop only after it, whole
    text.write_text(" ".join(["the king rode north to meet the queen at dawn"] * 40) + "\n")
    out = tmp_path / "p.json"
    assert main(["perplexity", "--model", str(model_dir), "--source", str(text), "--max-tokens", "25", "--json",
                 str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["tokens"] == 25 and res["documents"] == 1
    assert 0 < res["bytes"] < len(text.read_text()) / 2


@pytest.mark.parametrize("flags, expected", [
    (["--lengths", "16:32:1000000000"], "argument --lengths: expected a whole number from 1 to 10000, got "
                                        "'1000000000' in '16:32:1000000000'"),
    (["--lengths", "16:1e12:3"], "argument --lengths: expected a whole number from 16 to 1073741824, got '1e12'"),
    (["--lengths", "8,64"], "argument --lengths: expected a whole number from 16 to 1073741824, got '8'"),
    (["--depths", "0:100:0"], "argument --depths: expected a whole number from 1 to 10000, got '0'"),
    (["--depths", "50,101"], "argument --depths: expected a number from 0 to 100, got '101'"),
    (["--depths", "1:2"], "argument --depths: expected comma-separated, each a number from 0 to 100, or LO:HI:N"),
])
def test_niah_grids_are_bounded_by_the_parser(model_dir, tmp_path, capsys, monkeypatch, flags, expected):
    """A grid of a billion points took minutes to space before any check; a length past 2**30 was built as a
    haystack. Both are the parser's one-line refusal now, like every other numeric flag."""
    forbid(monkeypatch, "linlm.eval.niah.run_niah", why="a refused grid scores nothing")
    started = time.perf_counter()
    assert main(["niah", "--model", str(model_dir), "--json", str(tmp_path / "n.json"), *flags]) == 2
    assert time.perf_counter() - started < 5
    one_line_error(capsys.readouterr().err, expected)
    assert not (tmp_path / "n.json").exists()


def test_niah_length_beyond_memory_is_refused_before_any_haystack(model_dir, text_file, tmp_path, capsys,
                                                                  monkeypatch):
    """TNL has no position limit, so only memory bounds a length: the estimate refuses it before the haystack of
    2**30 tokens is read and tokenized."""
    import linlm.resources

    monkeypatch.setattr(linlm.resources, "available_memory", lambda device=None: (2**30, "a test"))
    forbid(monkeypatch, "linlm.eval.niah.build_haystack", why="no haystack may be built for a refused length")
    assert main(["niah", "--model", str(model_dir), "--haystack", str(text_file), "--lengths", "64,1073741824",
                 "--depths", "50", "--json", str(tmp_path / "n.json")]) == 2
    one_line_error(capsys.readouterr().err, "--lengths 1073741824: 4 haystacks of 1,073,741,824 tokens needs at "
                   "least", "1.0 GiB is available (a test)", "give shorter --lengths or a smaller --batch-size")
    assert not (tmp_path / "n.json").exists()
