"""`linlm eval`: the table, the JSON, and the bad-input messages (exit status 2)."""

import json

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
    assert "not written by linlm" in capsys.readouterr().err


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
