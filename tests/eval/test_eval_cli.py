"""`linlm eval`: the table, the JSON, and the bad-input messages (exit status 2); the single-file outputs of
`eval`, `perplexity` and `niah`, checked before the model loads."""

import json
from pathlib import Path

import pytest
from output_asserts import forbid, one_line_error, snapshot

from linlm.cli import main


def test_eval_cli_writes_table_and_json(model_dir, data_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps the table to the terminal's width
    out = tmp_path / "res.json"
    rc = main(["eval", "--model", str(model_dir), "--tasks", "commonsense,lambada", "--data-dir", str(data_dir),
               "--batch-size", "4", "--json", str(out), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "commonsense avg (7)" in text and "hellaswag" in text and "lambada" in text
    res = json.loads(out.read_text())
    assert res["format"] == "linlm-eval"
    assert set(res["tasks"]) == {"boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge",
                                 "openbookqa", "lambada"}
    assert 0 <= res["commonsense_avg"]["score"] <= 1
    # Run again: linlm replaces its own results file, but never a file it did not write.
    assert main(["eval", "--model", str(model_dir), "--tasks", "piqa", "--data-dir", str(data_dir), "--json", str(out),
                 "--quiet"]) == 0
    other = tmp_path / "notes.json"
    other.write_text("my notes")
    assert main(["eval", "--model", str(model_dir), "--tasks", "piqa", "--data-dir", str(data_dir), "--json",
                 str(other), "--quiet"]) == 2
    assert other.read_text() == "my notes"
    assert "linlm did not write it" in capsys.readouterr().err


def test_eval_cli_bad_input(model_dir, data_dir, tmp_path, capsys, tokenizer):
    assert main(["eval", "--model", str(model_dir), "--tasks", "piqa,bogus", "--data-dir", str(data_dir)]) == 2
    err = capsys.readouterr().err
    assert "unknown task 'bogus'" in err and "'hellaswag'" in err
    bad = tmp_path / "bad"
    bad.mkdir()
    lines = (data_dir / "piqa.jsonl").read_text().splitlines()
    (bad / "piqa.jsonl").write_text("\n".join(lines[:2] + ['{"query": "Q", "choices": ["a"], "gold": 0}'] + lines[2:]))
    assert main(["eval", "--model", str(model_dir), "--tasks", "piqa", "--data-dir", str(bad), "--quiet"]) == 2
    assert "piqa.jsonl:3: malformed line" in capsys.readouterr().err
    out = tmp_path / "r.json"
    assert main(["eval", "--model", str(model_dir), "--tasks", "piqa", "--data-dir", str(bad), "--skip-bad-lines",
                 "--json", str(out), "--quiet"]) == 0
    res = json.loads(out.read_text())["tasks"]["piqa"]
    assert res["n"] == 5 and res["skipped_lines"] == 1
    # A tokenizer larger than the model's vocabulary: a clear error naming both sizes.
    from linlm import create_model

    small = tmp_path / "small"
    create_model("tnl", preset="tiny", vocab_size=128).save(small)
    tokenizer.save(small)
    assert main(["eval", "--model", str(small), "--tasks", "piqa", "--data-dir", str(data_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "token ids but the model's vocab_size is 128" in err


def test_lm_eval_hook_cli(tmp_path, capsys):
    from linlm.eval.lm_eval_hook import PTH_NAME

    site = str(tmp_path)
    assert main(["lm-eval-hook", "status", "--site-dir", site]) == 0
    assert capsys.readouterr().out.startswith("not installed")
    assert main(["lm-eval-hook", "install", "--site-dir", site]) == 0
    assert (tmp_path / PTH_NAME).is_file()
    assert main(["lm-eval-hook", "status", "--site-dir", site]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("installed")
    assert main(["lm-eval-hook", "remove", "--site-dir", site]) == 0
    assert not (tmp_path / PTH_NAME).exists()
    (tmp_path / PTH_NAME).write_text("import foreign\n")
    assert main(["lm-eval-hook", "install", "--site-dir", site]) == 2
    assert "not written by linlm" in capsys.readouterr().err
    assert (tmp_path / PTH_NAME).read_text() == "import foreign\n"


HAY = "The rain had stopped and the grass was wet. He counted the coins twice and put them back in the box. " * 30


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading the model fails the test: every refusal below must come before it."""
    forbid(monkeypatch, "linlm.infer.generate.load_for_generation",
           why="the model was loaded before the command's outputs and flags were checked")


def _command(name: str, model_dir: Path, data_dir: Path, inputs: Path) -> list[str]:
    """A valid command line of `linlm NAME`, without its outputs."""
    text = inputs / "hay.txt"
    text.write_text(HAY)
    extra = {"eval": ["--tasks", "piqa", "--data-dir", str(data_dir), "--quiet"],
             "perplexity": ["--source", str(text)],
             "niah": ["--haystack", str(text), "--lengths", "120", "--depths", "0,100"]}[name]
    return [name, "--model", str(model_dir), *extra]


TARGETS = {
    "a user's file": (lambda out: out / "results.json", "linlm did not write it"),
    "an existing directory": (lambda out: out / "adir", "is a directory"),
    "a path under a file": (lambda out: out / "afile" / "x.json", "is a file and not a directory"),
    "an unwritable place": (lambda out: Path("/proc/linlm-test/x.json"), "cannot be written"),
}
FLAGS = [("eval", "--json"), ("perplexity", "--json"), ("niah", "--json"), ("niah", "--plot")]


@pytest.mark.parametrize("command, flag", FLAGS)
@pytest.mark.parametrize("target", list(TARGETS))
def test_an_output_linlm_may_not_write_is_refused_before_the_model_loads(command, flag, target, model_dir, data_dir,
                                                                       tmp_path, capsys, no_model_load):
    """One line, exit 2, nothing written, and the model never loaded: the check comes before any work."""
    inputs, out = tmp_path / "inputs", tmp_path / "out"
    inputs.mkdir()
    args = _command(command, model_dir, data_dir, inputs)
    (out / "adir").mkdir(parents=True)
    (out / "results.json").write_text("my notes")
    (out / "afile").write_text("a file")
    where, reason = TARGETS[target]
    before = snapshot(tmp_path)
    assert main([*args, flag, str(where(out))]) == 2
    one_line_error(capsys.readouterr().err, flag, reason)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command, flags, named", [
    ("perplexity", ["--stride", "0"], "--stride"),
    ("perplexity", ["--window", "0"], "--window"),
    ("perplexity", ["--chunk", "0"], "--chunk"),
    ("perplexity", ["--max-docs", "0"], "--max-docs"),
    ("perplexity", ["--max-tokens", "-3"], "--max-tokens"),
    ("eval", ["--max-length", "0"], "--max-length"),
    ("eval", ["--max-length", "-1"], "--max-length"),
    ("eval", ["--batch-size", "0"], "--batch-size"),
    ("eval", ["--limit", "0"], "--limit"),
    ("niah", ["--batch-size", "0"], "--batch-size"),
    ("niah", ["--depths", "0:100:0"], "--depths"),
    ("niah", ["--lengths", "0:400:3"], "--lengths"),
])
def test_zero_is_a_value_never_the_default(command, flags, named, model_dir, data_dir, tmp_path, capsys,
                                           no_model_load):
    """A 0 (or a negative count) the user typed is refused in one line before the model loads; only a flag left
    out takes its default."""
    assert main([*_command(command, model_dir, data_dir, tmp_path), *flags]) == 2
    one_line_error(capsys.readouterr().err, named)


def test_a_missing_data_dir_is_refused_before_the_model_loads(model_dir, tmp_path, capsys, no_model_load):
    assert main(["eval", "--model", str(model_dir), "--tasks", "piqa", "--data-dir", str(tmp_path / "nope")]) == 2
    one_line_error(capsys.readouterr().err, "nope: not a directory; pass --data-dir")


def test_progress_stays_off_stdout_and_off_a_non_terminal(model_dir, data_dir, capsys, monkeypatch):
    """The progress bar goes to stderr and only on a terminal: without --quiet a piped run prints what --quiet
    prints, and nothing on stderr."""
    monkeypatch.setenv("COLUMNS", "200")
    args = ["eval", "--model", str(model_dir), "--tasks", "piqa", "--data-dir", str(data_dir), "--batch-size", "4"]
    assert main(args + ["--quiet"]) == 0
    quiet = capsys.readouterr()
    assert main(args) == 0
    shown = capsys.readouterr()
    assert shown.out == quiet.out and "piqa" in shown.out
    assert "━" not in shown.err and shown.err == quiet.err
