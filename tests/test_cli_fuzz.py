"""Every numeric flag of every command at 0, -1, 10^12 and a non-number: a one-line refusal (exit 2, no traceback)
or a success, within seconds. The flags come from the parser itself (a new flag is tried without a new test), each
on a small real command line of its command (a tiny model, a short text, a synthetic sweep), in-process."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from linlm.cli import build_parser, main
from linlm.cli_ranges import Number, NumberList, numeric_flags, numeric_type

VALUES = ["0", "-1", str(10**12), "x"]
REFUSED_WITHIN_S = 5.0  # a refusal is one parse or one check: milliseconds on an idle machine
DONE_WITHIN_S = 60.0  # a success runs for real on tiny inputs (a shared 2-core machine is slow)

FLAGS = [(words, action.option_strings[0]) for words, action in numeric_flags(build_parser())]


def test_the_flags_come_from_the_parser_and_each_has_a_range():
    found = {(" ".join(words), flag) for words, flag in FLAGS}
    # a few of every kind, to be sure the walk reaches nested subcommands and lists
    assert {("train", "--steps"), ("scaling fit", "--bootstrap"), ("data prepare", "--seed"),
            ("profile", "--contexts"), ("mqar", "--widths"), ("reproduce", "--seeds")} <= found
    plain = [(w, a.option_strings) for w, a in numeric_flags(build_parser()) if numeric_type(a) is None]
    assert plain == [], f"numeric flags without a range in linlm.cli_ranges.RANGES: {plain}"
    assert len(FLAGS) >= 60


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The inputs of each command's base command line: a tiny saved LLaMA with its tokenizer, a short text, task
    files and a small synthetic sweep."""
    from linlm import create_model
    from linlm.data.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("fuzz")
    words = "the king and queen of a land far away ride north to meet their old friend at dawn".split()
    g = torch.Generator().manual_seed(0)
    lines = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (12,), generator=g)) for _ in range(24)]
    text = root / "text.txt"
    text.write_text("\n".join(lines) + "\n")
    tok = Tokenizer.train(lines * 3, 300)
    torch.manual_seed(0)
    model = create_model("llama", preset="tiny", vocab_size=320, max_seq_len=64).eval()
    model.save(root / "model")
    tok.save(root / "model")
    sys.path.insert(0, str(Path(__file__).parent / "scaling"))
    try:
        from scaling_helpers import synthetic_sweep
    finally:
        sys.path.pop(0)
    sweep = synthetic_sweep(root / "sweep", archs=("llama",), sizes=4)
    return {"root": root, "text": text, "model": root / "model", "sweep": sweep,
            "tasks": Path(__file__).parent / "eval" / "data"}


def base_argv(words: tuple[str, ...], w: dict, tmp: Path) -> list[str]:
    """A small command line of each command that runs for real in seconds; the flag under test is appended (the
    last value of a flag wins)."""
    model, text = str(w["model"]), str(w["text"])
    return {
        ("count",): ["count", "--preset", "tiny"],
        ("demo",): ["demo", "--out", str(tmp / "demo")],
        ("data", "prepare"): ["data", "prepare", "--source", text, "--tokenizer", "bpe:300", "--out",
                              str(tmp / "data"), "--no-progress"],
        ("train",): ["train", "--config", "demo", "--print-config"],
        ("generate",): ["generate", "--model", model, "--prompt", "the king", "--max-new-tokens", "2"],
        ("profile",): ["profile", "--archs", "tnl", "--preset", "tiny", "--contexts", "8", "--decode-tokens", "1",
                       "--no-hf"],
        ("export",): ["export", "--model", model, "--out", str(tmp / "export" / "m")],
        ("eval",): ["eval", "--model", model, "--data-dir", str(w["tasks"]), "--tasks", "piqa", "--limit", "2",
                    "--quiet"],
        ("perplexity",): ["perplexity", "--model", model, "--source", text],
        ("niah",): ["niah", "--model", model, "--haystack", text, "--lengths", "32", "--depths", "50"],
        ("mqar",): ["mqar", "--out", str(tmp / "mqar"), "--archs", "llama", "--widths", "16", "--mossnet-experts",
                    "0", "--steps", "1", "--batch-size", "2", "--layers", "1", "--vocab-size", "16", "--num-kv", "2",
                    "--test-sequences", "2"],
        ("scaling", "run"): ["scaling", "run", "--ladder", "smoke", "--archs", "llama", "--out", str(tmp / "sweep"),
                             "--dry-run", "--no-measure"],
        ("scaling", "fit"): ["scaling", "fit", str(w["sweep"]), "--bootstrap", "0", "--parametric-bootstrap", "0"],
        ("scaling", "report"): ["scaling", "report", str(w["sweep"]), "--out", str(tmp / "report"), "--bootstrap",
                                "0", "--parametric-bootstrap", "0"],
        ("scaling", "study"): ["scaling", "study", str(tmp)],
        ("reproduce",): ["reproduce", "--out", str(tmp / "job"), "--dry-run"],
        ("serve",): ["serve", model, "--port", "8000"],
        ("check",): ["check", "--archs", "gla", "--attn-every", "2"],
        ("scaling", "evaluate"): ["scaling", "evaluate", str(w["sweep"])],
    }[words]


@pytest.mark.parametrize("words, flag", FLAGS, ids=[f"{' '.join(w)} {f}" for w, f in FLAGS])
def test_every_numeric_flag_is_refused_in_one_line_or_honoured(world, tmp_path, monkeypatch, capsys, cache_env,
                                                                words, flag):
    monkeypatch.chdir(tmp_path)
    # a server that starts would wait for requests: it starts nothing here, and returns at once
    monkeypatch.setitem(sys.modules, "uvicorn", type(sys)("uvicorn"))
    sys.modules["uvicorn"].run = lambda *a, **k: None
    for value in VALUES:
        argv = base_argv(words, world, tmp_path / f"v{VALUES.index(value)}") + [flag, value]
        started = time.perf_counter()
        status = main(argv)  # an exception (a traceback) fails the test
        took = time.perf_counter() - started
        err = capsys.readouterr().err
        assert status in (0, 2), (argv, status, err)
        assert "Traceback" not in err, (argv, err)
        if status == 2:
            errors = [line for line in err.splitlines() if line.startswith("linlm: error: ")]
            assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], (argv, err)
            if f"argument {flag}" in errors[0]:  # the parser's refusal
                assert took < REFUSED_WITHIN_S, (argv, took)
        assert took < DONE_WITHIN_S, (argv, took)


@pytest.mark.parametrize("words, flag", FLAGS, ids=[f"{' '.join(w)} {f}" for w, f in FLAGS])
def test_a_value_out_of_range_is_refused_by_the_parser_naming_the_range(capsys, words, flag):
    """The parser's own refusal: every numeric flag names itself, its range and the value given."""
    kind = next(numeric_type(a) for w, a in numeric_flags(build_parser()) if w == words and a.option_strings[0] == flag)
    item = kind.item if isinstance(kind, NumberList) else kind
    assert isinstance(item, Number)
    for value in ("x", "nan"):
        assert main([*words, flag, value]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"argument {flag}" in err and f"expected {item.describe()}" in err
        assert f"'{value}'" in err
