"""The sections' typed settings: a recipe is checked against each section's dataclass when it loads (a key no
section reads is one line and exit 2, before any work); a new section is one module and one line in the section
list, and is then in the dry run, the run, the report and the resume; the dry run makes the real run's checks,
plans what it would do, prints no "None" and writes nothing; docs/reproduce.md's settings table is the
dataclasses'."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

import linlm.reproduce.recipes as recipes
from linlm.cli import main
from linlm.reproduce import run, sections
from linlm.reproduce.recipes import load_recipe, recipe_names

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def recipe_dir(tmp_path, monkeypatch) -> Path:
    """The built-in recipes copied into a folder of the test's, where it may add its own."""
    folder = tmp_path / "recipes"
    shutil.copytree(recipes.RECIPE_DIR, folder)
    monkeypatch.setattr(recipes, "RECIPE_DIR", folder)
    return folder


@pytest.fixture
def no_timing(monkeypatch):
    """The dry run's step timing (it trains a few steps of every run) left out: these tests read the plan's text."""
    import importlib
    import pkgutil

    import linlm.reproduce.sections
    import linlm.scaling.estimate
    from linlm.reproduce.sections import mqar_training

    monkeypatch.setattr(linlm.scaling.estimate, "estimate", lambda rows, *a, **k: rows)
    # Every section that times MQAR-style training (mqar, aspect, context, hybrid, and any added later).
    timed = mqar_training.seconds
    for info in pkgutil.iter_modules(linlm.reproduce.sections.__path__):
        module = importlib.import_module(f"linlm.reproduce.sections.{info.name}")
        if getattr(module, "seconds", None) is timed:
            monkeypatch.setattr(module, "seconds", lambda settings, task, configs: 60.0 * len(configs))


def test_a_key_no_section_reads_is_one_line_and_exit_2_before_any_work(recipe_dir, tmp_path, capsys):
    (recipe_dir / "typo.yaml").write_text(yaml.safe_dump({"base": "smoke", "name": "typo", "mqr": {"seeds": 2}}))
    out = tmp_path / "job"
    for dry in ([], ["--dry-run"]):
        assert main(["reproduce", "--recipe", "typo", "--out", str(out), *dry]) == 2
        err = capsys.readouterr().err.strip()
        assert err.splitlines() == [err] and "key 'mqr' is read by no section" in err and "'mqar'" in err
        assert not out.exists()
    # A field a section's dataclass does not have, and a value it refuses, are named with the key that holds them.
    (recipe_dir / "typo.yaml").write_text(yaml.safe_dump({"base": "smoke", "name": "typo",
                                                          "quality": {"max_tokns": 5}}))
    with pytest.raises(Exception, match=r"typo.yaml: quality.max_tokns: unknown key 'max_tokns'; did you mean "
                                        r"'max_tokens'"):
        load_recipe("typo")
    (recipe_dir / "typo.yaml").write_text(yaml.safe_dump({"base": "smoke", "name": "typo", "niah": {"mode": "x"}}))
    with pytest.raises(Exception, match=r"typo.yaml: niah: mode: unknown NIAH mode 'x'"):
        load_recipe("typo")


def test_every_recipe_holds_typed_settings_with_their_defaults():
    from linlm.eval.niah import NIAHConfig
    from linlm.reproduce.sections.mqar import MQARSettings

    for name in recipe_names():
        recipe = load_recipe(name)
        for key, cls in sections.recipe_keys().items():
            assert isinstance(getattr(recipe, key), cls), (name, key)
    smoke = load_recipe("smoke")
    # A field the recipe does not give takes the dataclass's default, the one place defaults are written.
    assert smoke.mqar.head_dim == MQARSettings().head_dim and smoke.niah.seed == NIAHConfig().seed
    assert smoke.mqar.widths == [16] and smoke.fits.bootstrap == 50  # ... and one it gives is its own


def test_a_new_section_is_one_module_and_one_line(recipe_dir, tmp_path, monkeypatch, fakes, capsys, no_timing):
    """The toy section (tests/reproduce/toy_section.py) added to the list: its recipe key is checked, and it is in
    the dry run, the run, the report, results.json and the resume (read back, not run again)."""
    import toy_section

    (recipe_dir / "toy.yaml").write_text(yaml.safe_dump({"base": "smoke", "name": "toy",
                                                         "toy": {"greeting": "hi", "repeat": 3}}))
    out = tmp_path / "job"
    assert main(["reproduce", "--recipe", "toy", "--out", str(out), "--dry-run"]) == 2  # not in the list yet
    assert "key 'toy' is read by no section" in capsys.readouterr().err
    monkeypatch.setattr(sections, "SECTIONS", (*sections.SECTIONS, toy_section.SECTION))  # the one line
    toy_section.CALLS.clear()
    assert main(["reproduce", "--recipe", "toy", "--out", str(out), "--dry-run"]) == 0
    assert "toy: says 'hi' 3 times" in capsys.readouterr().out and not out.exists()
    (recipe_dir / "bad.yaml").write_text(yaml.safe_dump({"base": "smoke", "name": "bad", "toy": {"repeat": 0}}))
    assert main(["reproduce", "--recipe", "bad", "--out", str(out)]) == 2
    assert "bad.yaml: toy: repeat: 0; give 1 or more" in capsys.readouterr().err and not out.exists()

    result = run("toy", out, say=lambda text: None)
    assert toy_section.CALLS == ["hi"] and not result["failed"]
    assert json.loads((out / "sections" / "toy.json").read_text()) == {"said": "hi hi hi"}
    assert "## A toy section" in (out / "report.md").read_text() and "The toy said: hi hi hi." in (
        out / "report.md").read_text()
    assert json.loads((out / "results.json").read_text())["sections"]["toy"] == {"said": "hi hi hi"}
    again = run("toy", out, say=lambda text: None)  # resumed: read back, not run again
    assert toy_section.CALLS == ["hi"] and "The toy said: hi hi hi." in again["report"].md.read_text()
    capsys.readouterr()
    assert main(["reproduce", "--recipe", "toy", "--out", str(out), "--dry-run"]) == 0  # the job's own plan
    assert "toy: says 'hi' 3 times (done)" in capsys.readouterr().out and toy_section.CALLS == ["hi"]
    # docs/reproduce.md's table would list it: its rows come from the dataclass.
    assert ["toy", "toy", "greeting", "hello", "what the toy section says"] in sections.settings_rows()


def test_the_dry_run_prints_no_none_for_any_recipe(tmp_path, capsys, no_timing):
    for name in recipe_names():
        assert main(["reproduce", "--recipe", name, "--out", str(tmp_path / name), "--dry-run"]) == 0
        text = capsys.readouterr().out
        assert "[evaluation and retrieval]" in text and not re.search(r"\bNone\b", text), (name, text)
        assert not (tmp_path / name).exists()


def test_the_dry_run_says_which_claims_the_settings_cannot_decide(tmp_path, capsys, no_timing):
    from linlm.reproduce.claims import CLAIMS

    assert main(["reproduce", "--recipe", "smoke", "--out", str(tmp_path / "s"), "--dry-run"]) == 0
    claims = capsys.readouterr().out.split("[claims]", 1)[1]
    assert all(c.statement in claims for c in CLAIMS)
    assert ("Linear models scale like transformers: cannot tell with these settings: no size of the scaling ladder "
            "is trained with a second seed") in claims
    assert "MossNet beats transformer and SSM baselines: cannot tell with these settings: the comparison trains one " \
           "seed per architecture" in claims
    # --seeds 3 gives the comparison a spread. The cpu recipe runs no MQAR (nor the studies on its task): it can
    # decide the scaling and MossNet's comparison and decoding claims; cpu-long trains the rest.
    assert main(["reproduce", "--recipe", "smoke", "--out", str(tmp_path / "s"), "--dry-run", "--seeds", "3"]) == 0
    assert "MossNet beats transformer and SSM baselines: can be decided" in capsys.readouterr().out
    assert main(["reproduce", "--recipe", "cpu", "--out", str(tmp_path / "c"), "--dry-run"]) == 0
    text = capsys.readouterr().out
    why = {ln.split(": cannot tell with these settings: ")[0].strip(): ln.split(": cannot tell with these settings: ")[1]
           for ln in text.split("[claims]", 1)[1].splitlines() if "cannot tell" in ln}
    no_mqar = "the recipe runs no MQAR experiment"
    assert why == {
        "Linear models are weaker at retrieval": no_mqar, "Data-dependent decay helps retrieval": no_mqar,
        "Shape (aspect ratio) matters more for linear models than for LLaMA": "the recipe runs no aspect study",
        "Shape (context length) matters more for linear models than for LLaMA": "the recipe runs no context study",
        "SSM experts act as heads (MossNet's E experts recall better than one)": no_mqar,
        "MossNet scales at least as well as its baselines": "the recipe trains no mossnet ladder",
        "The delta rule recalls better than a gated linear state of the same size": no_mqar,
        "A few attention layers give a linear model back its recall": "the recipe runs no hybrid study"}, why
    assert "  MQAR: not in this recipe" in text and "(at most" not in text
    assert "training time here: about" in text and "max_steps" not in text  # no run counted at a bound
    assert main(["reproduce", "--recipe", "cpu-long", "--out", str(tmp_path / "l"), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "(at most 10 min here" in text  # the MQAR section's time (10 configurations, 60 s each here) is counted
    assert "each MQAR and study run at its max_steps" in text
    assert not [ln for ln in text.split("[claims]", 1)[1].splitlines() if "retrieval: cannot tell" in ln]
    assert "A few attention layers give a linear model back its recall: can be decided" in text


def test_the_dry_run_makes_the_real_runs_checks_and_writes_nothing(tmp_path, capsys):
    a_file = tmp_path / "tasks.jsonl"
    a_file.write_text("{}\n")
    out = tmp_path / "job"
    cases = {("--data-dir", str(a_file)): "--data-dir", ("--scaling-dir", str(tmp_path / "nosuch")): "--scaling-dir",
             ("--set", "optim.lrr=1"): "optim.lrr", ("--seeds", "1000000"): "--seeds: expected a whole number from 1 to 100",
             ("--set", "steps=5"): "--set steps: each run's steps come from its rung's tokens"}
    for flags, named in cases.items():
        for dry in (["--dry-run"], []):
            started = time.monotonic()
            assert main(["reproduce", "--recipe", "smoke", "--out", str(out), *flags, *dry]) == 2, flags
            err = capsys.readouterr().err.strip()
            assert err.splitlines() == [err] and named in err, (flags, err)
            assert time.monotonic() - started < 10 and not out.exists()


def test_the_dry_run_plans_a_finished_scaling_dir_as_done(tmp_path, capsys, fakes, no_timing):
    from linlm.scaling.ladder import load_ladder

    sweep = tmp_path / "sweep"
    fakes.train_sweep(load_ladder("smoke"), sweep, lambda f: None, print, {})  # a finished sweep of the ladder
    out = tmp_path / "job"

    def scaling_rows(*flags) -> list[str]:
        assert main(["reproduce", "--recipe", "smoke", "--out", str(out), "--dry-run", *flags]) == 0
        text = capsys.readouterr().out
        block = text.split("[scaling]", 1)[1].split("\n\n", 1)[0]
        return [line for line in block.splitlines() if re.match(r"(llama|tnl|hgrn2|cosformer2)-", line)]

    own, given = scaling_rows(), scaling_rows("--scaling-dir", str(sweep))
    assert own and all(line.split()[-1] == "todo" for line in own)
    assert len(given) == len(own) and all(line.split()[-1] == "done" for line in given)
    assert not out.exists()


def test_the_settings_table_of_the_docs_is_the_dataclasses():
    text = (ROOT / "docs" / "reproduce.md").read_text(encoding="utf-8")
    block = text.split("<!-- settings:", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip().strip("`") for c in line.strip().strip("|").split(" | ")] for line in block.splitlines()[1:]
            if line.startswith("|")][2:]
    assert rows == [[k, readers, f, d, doc] for k, readers, f, d, doc in sections.settings_rows()], (
        "docs/reproduce.md's settings table differs from the sections' dataclasses: print the rows with "
        "linlm.reproduce.sections.settings_markdown() and paste them")


def test_a_recipes_scaling_archs_are_some_of_its_ladders_own():
    from linlm.errors import ConfigError
    from linlm.reproduce.sections.training import ScalingSettings
    from linlm.scaling.ladder import load_ladder

    chosen = ScalingSettings(ladder="cpu", archs=["llama", "hgrn2"]).validate()
    assert chosen.load().archs == ["llama", "hgrn2"]
    assert ScalingSettings(ladder="cpu").validate().load().archs == load_ladder("cpu").archs  # null: every one
    for bad in (["llama", "nope"], [], ["llama", "llama"]):
        with pytest.raises(ConfigError, match=r"^archs: .* name each once, among ladder cpu's \(llama, tnl"):
            ScalingSettings(ladder="cpu", archs=bad).validate()


def test_downstream_keeps_checkpoints_through_the_ladder_and_refuses_bad_settings(recipe_dir, tmp_path, capsys,
                                                                                   no_timing):
    """scaling.keep_log reaches every run's training config as checkpoint.keep_log; 0 leaves the ladder as it is and
    the downstream section out of the plan; impossible values are named with their key before any work."""
    from linlm.errors import ConfigError
    from linlm.reproduce.sections.downstream import DownstreamSettings
    from linlm.reproduce.sections.training import MAX_KEPT, ScalingSettings
    from linlm.scaling.ladder import load_ladder

    kept = ScalingSettings(ladder="smoke", keep_log=5).validate().load()
    assert kept.train["checkpoint"] == {**load_ladder("smoke").train["checkpoint"], "keep_log": 5}
    assert ScalingSettings(ladder="smoke").validate().load().train == load_ladder("smoke").train
    for bad in (-1, MAX_KEPT + 1):
        with pytest.raises(ConfigError, match=rf"^keep_log: {bad}; give 0 .* to {MAX_KEPT}"):
            ScalingSettings(ladder="smoke", keep_log=bad).validate()
    with pytest.raises(ConfigError, match="^limit: 0; give at least 1 item"):
        DownstreamSettings(limit=0).validate()
    with pytest.raises(ConfigError, match="^trials: 0; give 1 to"):
        DownstreamSettings(trials=0).validate()
    (recipe_dir / "bad.yaml").write_text(yaml.safe_dump({"base": "smoke", "name": "bad",
                                                         "downstream": {"trials": -3}}))
    assert main(["reproduce", "--recipe", "bad", "--out", str(tmp_path / "job"), "--dry-run"]) == 2
    assert "downstream: trials: -3; give 1 to" in capsys.readouterr().err
    for name, line in [("smoke", "each scaling run's 2 log-spaced kept checkpoints"),
                       ("cpu", "downstream against compute: not in this recipe")]:
        assert main(["reproduce", "--recipe", name, "--out", str(tmp_path / name), "--dry-run"]) == 0
        assert line in capsys.readouterr().out
