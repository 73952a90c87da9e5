"""One override dialect for every command, accepted anywhere on the command line; checked numbers."""

from __future__ import annotations

import json

import pytest
import yaml

from linlm.cli import main


def test_train_takes_overrides_after_flags(capsys):
    # torchrun command lines put the overrides last, after flags
    argv = ["train", "--config", "demo", "steps=7", "--print-config", "optim.lr=0.01", "--quiet", "seed=3",
            "--set", "eval.every=5"]
    assert main(argv) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert (cfg["steps"], cfg["optim"]["lr"], cfg["seed"], cfg["eval"]["every"]) == (7, 0.01, 3, 5)


def test_a_word_that_is_not_an_override_is_still_refused(capsys):
    assert main(["train", "--print-config", "steps=3", "--quiet", "stray"]) == 2
    assert "unrecognized arguments: stray" in capsys.readouterr().err


def test_demo_takes_overrides_after_flags(monkeypatch):
    import linlm.commands.demo

    seen = {}

    class Result:
        interrupted = None

    monkeypatch.setattr(linlm.commands.demo, "run_demo", lambda **kw: seen.update(kw) or Result())
    assert main(["demo", "optim.lr=0.1", "--steps", "5", "seed=2", "--set", "eval.every=0"]) == 0
    assert seen["steps"] == 5 and seen["overrides"] == ["optim.lr=0.1", "seed=2", "eval.every=0"]


def test_count_uses_the_train_dialect_anywhere_on_the_line(capsys):
    assert main(["count", "--arch", "tnl", "model.overrides.vocab_size=1024", "--preset", "tiny", "--json",
                 "--set", "model.overrides.n_layers=3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["vocab_size"] == 1024 and out["config"]["n_layers"] == 3
    assert main(["count", "--preset", "tiny", "model.arch=hgrn2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["arch"] == "hgrn2"


def test_count_old_spelling_names_the_new_one(capsys):
    assert main(["count", "--arch", "tnl", "--preset", "tiny", "--set", "vocab_size=8192"]) == 2
    err = capsys.readouterr().err
    assert "model.overrides.vocab_size=8192" in err and "Traceback" not in err
    assert main(["count", "--preset", "tiny", "steps=3"]) == 2
    assert "model.overrides" in capsys.readouterr().err


@pytest.mark.parametrize("argv, expected", [
    (["count", "--set", "model.overrides.norm_eps=nan"], "model.overrides.norm_eps: expected a finite number"),
    (["count", "model.overrides.init_std=inf"], "model.overrides.init_std: expected a finite number"),
    (["train", "--print-config", "optim.lr=.inf"], "optim.lr: expected a finite number"),
    (["train", "--print-config", "--set", "model.overrides.norm_eps=nan"], "norm_eps: expected a finite number"),
])
def test_non_finite_numbers_are_refused_on_the_command_line(capsys, argv, expected):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and err.rstrip().endswith("(set on the command line)") and "Traceback" not in err


@pytest.mark.parametrize("argv, expected", [
    (["train", "--print-config", "--lr", "nan"], "train: argument --lr: expected a number > 0 and <= 10000, got 'nan'"),
    (["train", "--print-config", "--lr", "inf"], "train: argument --lr: expected a number > 0 and <= 10000, got 'inf'"),
])
def test_non_finite_flags_are_refused_by_the_parser(capsys, argv, expected):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"linlm: error: {expected}") and len(err.splitlines()) == 1


@pytest.mark.parametrize("flag, value", [("--batch-size", "-5"), ("--batch-size", "0"), ("--seq-len", "-1"),
                                         ("--batch", "x")])
def test_count_refuses_a_batch_or_length_that_is_not_positive(capsys, flag, value):
    assert main(["count", "--preset", "tiny", flag, value]) == 2
    err = capsys.readouterr().err
    assert "expected a whole number from 1 to " in err and f"got '{value}'" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_later_override_wins_whichever_its_form(capsys):
    argv = ["train", "--print-config", "--set", "steps=1", "steps=2", "--quiet", "--set", "steps=3", "seed=1",
            "--set=seed=2"]
    assert main(argv) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert (cfg["steps"], cfg["seed"]) == (3, 2)


# (a command line in today's spelling, the old spelling of one of its options, that option, its dest, its value)
OLD_SPELLINGS = [
    (["train", "--out", "runs/x"], "--out-dir", "--out", "out_dir", "runs/x"),
    (["demo", "--out", "runs/x"], "--out-dir", "--out", "out_dir", "runs/x"),
    (["mqar", "--out", "runs/x"], "--out-dir", "--out", "out_dir", "runs/x"),
    (["generate", "--model", "runs/x"], "--checkpoint", "--model", "model", "runs/x"),
    (["count", "--batch-size", "3"], "--batch", "--batch-size", "batch", 3),
    (["export", "--model", "m", "--out", "e", "--batch-size", "3"], "--batch", "--batch-size", "batch", 3),
    (["reproduce", "--recipe", "cpu", "--out", "x"], "--preset", "--recipe", "recipe", "cpu"),
]


@pytest.mark.parametrize("argv, old, new, dest, value", OLD_SPELLINGS,
                         ids=[f"{argv[0]} {old}" for argv, old, *_ in OLD_SPELLINGS])
def test_an_old_spelling_is_the_same_option_and_the_help_says_so(capsys, argv, old, new, dest, value):
    from linlm.cli import build_parser
    from linlm.cli_args import parse_args

    given = vars(parse_args(build_parser(), argv))
    assert given[dest] == value
    old_argv = [old if word == new else word for word in argv]
    assert old_argv != argv and vars(parse_args(build_parser(), old_argv)) == given
    with pytest.raises(SystemExit):
        main([argv[0], "--help"])
    assert f"old spelling: {old})" in " ".join(capsys.readouterr().out.split())


def test_comma_lists_convert_strip_and_skip_empty_items():
    from linlm.cli_args import comma_list

    assert comma_list(" tnl, llama ,,", "--archs") == ["tnl", "llama"]
    assert comma_list("512,2048,", "--contexts", item=int, minimum=1) == [512, 2048]
    assert comma_list("0, 50.5", "--depths", item=float) == [0.0, 50.5]
    assert comma_list(" , ", "--archs", empty_ok=True) == []


@pytest.mark.parametrize("argv", [["--archs", "tnl,llama"], ["--archs", "tnl", "llama"], ["--archs", "tnl,", "llama"]])
def test_check_and_demo_take_archs_comma_or_space_separated(monkeypatch, argv):
    import linlm.commands.check
    import linlm.commands.demo

    seen = {}

    class Result:
        interrupted = None

    monkeypatch.setattr(linlm.commands.demo, "run_demo", lambda **kw: seen.update(demo=kw["archs"]) or Result())
    monkeypatch.setattr(linlm.commands.check, "run_check", lambda **kw: seen.update(check=kw["archs"]))
    assert main(["demo", *argv]) == 0 and main(["check", *argv]) == 0
    assert seen == {"demo": ["tnl", "llama"], "check": ["tnl", "llama"]}
    main(["check"])
    assert seen["check"] is None  # not given: every registered architecture


@pytest.mark.parametrize("text, kwargs, expected", [
    ("8,abc", dict(item=int, what="integers >= 1", example="512,2048"),
     "--contexts: expected comma-separated integers >= 1, got '8,abc' (e.g. 512,2048)"),
    ("8,0", dict(item=int, what="integers >= 1", minimum=1), "--contexts: expected comma-separated integers >= 1, "
                                                               "got '8,0'"),
    (",", dict(), "--contexts: expected comma-separated names, got ','"),
])
def test_a_bad_comma_list_is_one_config_error_naming_the_flag(text, kwargs, expected):
    from linlm.cli_args import comma_list
    from linlm.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        comma_list(text, "--contexts", **kwargs)
    assert str(e.value) == expected


@pytest.mark.parametrize("argv, expected", [
    (["profile", "--archs", "tnl", "--preset", "tiny", "--contexts", "8,0"],
     "profile: argument --contexts: expected a whole number from 1 to 1073741824, got '0' in '8,0'"),
    (["mqar", "--out-dir", "unused", "--widths", "16,x"],
     "mqar: argument --widths: expected a whole number from 1 to 1048576, got 'x' in '16,x'"),
    (["niah", "--model", "unused", "--lengths", "100,abc"],
     "niah: argument --lengths: expected a whole number from 16 to 1073741824, got 'abc' in '100,abc'"),
])
def test_every_command_refuses_a_bad_list_before_any_work(tmp_path, monkeypatch, capsys, argv, expected):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("linlm: error: ") and expected in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_demo_refuses_two_architectures_instead_of_dropping_one(tmp_path, capsys, monkeypatch):
    from output_asserts import forbid, one_line_error

    forbid(monkeypatch, "linlm.train.trainer.train", why="a refused demo trains nothing")
    for argv in (["--archs", "tnl", "llama"], ["--archs", "tnl,llama"]):
        assert main(["demo", "--out", str(tmp_path / "d"), *argv]) == 2
        one_line_error(capsys.readouterr().err, "--archs: the demo trains one architecture, got 2 (tnl, llama)")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("argv", [
    ["reproduce", "--dry-run", "--seeds", "1000000"],
    ["mqar", "--seeds", "1000000", "--steps", "1"],
])
def test_a_million_seeds_is_refused_at_once(tmp_path, capsys, argv):
    import time

    from output_asserts import one_line_error

    started = time.perf_counter()
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert time.perf_counter() - started < 5
    one_line_error(capsys.readouterr().err, "argument --seeds: expected a whole number from 1 to 100", "'1000000'")
    assert not (tmp_path / "o").exists()
