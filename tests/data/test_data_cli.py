"""`linlm data prepare`: parses, calls prepare(), prints a summary; user mistakes exit 2 without a traceback."""

from __future__ import annotations

import argparse
import json

import pytest

from linlm.data.cli import register
from linlm.errors import DataError


def _parse(argv):
    parser = argparse.ArgumentParser(prog="linlm")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_prepare_command(corpus_dir, tiny_tokenizer, tmp_path, capsys):
    tiny_tokenizer.save(tmp_path / "tok")
    out = tmp_path / "out"
    args = _parse(["data", "prepare", "--source", str(corpus_dir), "--tokenizer", str(tmp_path / "tok"),
                   "--out", str(out), "--val-fraction", "0.1", "--seed", "2", "--shard-tokens", "5000",
                   "--no-progress"])
    assert args.func(args) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["config"]["val_fraction"] == 0.1 and meta["config"]["seed"] == 2
    assert meta["config"]["shard_tokens"] == 5000 and meta["tokenizer"]["spec"] == str(tmp_path / "tok")
    printed = capsys.readouterr().out
    assert f"{meta['splits']['train']['tokens']:,} tokens" in printed and "60 documents" in printed


def test_prepare_command_trains_bpe_and_refuses_another_config(corpus_dir, tmp_path):
    base = ["data", "prepare", "--source", str(corpus_dir), "--out", str(tmp_path / "out"), "--no-progress"]
    args = _parse(base + ["--tokenizer", "bpe:280"])
    assert args.func(args) == 0
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["vocab_size"] == 280
    args = _parse(base + ["--tokenizer", "bpe:290"])
    with pytest.raises(DataError, match="different tokenizer"):
        args.func(args)
    args = _parse(base + ["--tokenizer", "bpe:290", "--overwrite"])
    assert args.func(args) == 0


def test_main_exits_2_with_a_message(tmp_path, capsys):
    main = pytest.importorskip("linlm.cli").main
    code = main(["data", "prepare", "--source", str(tmp_path / "missing"), "--tokenizer", "bpe:300",
                 "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "not found" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_package_exports():
    import linlm.data as data
    import linlm.data.prepare as prepare_module
    from linlm.data.loader import Batches
    from linlm.data.tokenizer import Tokenizer

    assert data.Tokenizer is Tokenizer and data.Batches is Batches
    assert callable(prepare_module.prepare) and prepare_module.__name__ == "linlm.data.prepare"
    with pytest.raises(AttributeError):
        data.no_such_name
