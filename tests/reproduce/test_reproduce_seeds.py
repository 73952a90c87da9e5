"""linlm reproduce with seeds: the comparison trained once per seed, the spread over seeds, the rule that counts a
difference only beyond it, a bad seed count refused before any work, and NIAH verdicts that carry the chance level."""

from __future__ import annotations

import dataclasses
import shutil
from types import SimpleNamespace

import pytest

from linlm.cli import main
from linlm.errors import ConfigError
from linlm.reproduce import seeds as S
from linlm.reproduce.recipes import load_recipe


def test_the_spread_over_seeds():
    spread = S.Spread([1.0, 2.0, 4.0])
    assert (spread.mean, spread.lo, spread.hi) == (pytest.approx(7 / 3), 1.0, 4.0)
    assert spread.std == pytest.approx(((4 / 3) ** 2 + (1 / 3) ** 2 + (5 / 3) ** 2) ** 0.5 / 2 ** 0.5)
    assert S.Spread([2.0]).std is None and "one seed" in S.Spread([2.0]).text()


def test_each_architecture_trains_once_per_seed():
    from linlm.reproduce.job import Job
    from linlm.scaling.ladder import plan_runs

    cpu = load_recipe("cpu")
    runs = plan_runs(Job(cpu, None).compare_ladder(), None, "/nonexistent")
    assert cpu.seeds == 3 and len(runs) == 3 * 3
    by_seed = {}
    for r in runs:
        by_seed.setdefault(r.arch, []).append((r.name, r.config.seed))
    assert by_seed["mossnet"] == [("mossnet-0.8m-s0", 0), ("mossnet-0.8m-s1", 1), ("mossnet-0.8m-s2", 2)]
    assert len({(r.params, r.tokens) for r in runs if r.arch == "llama"}) == 1  # seeds differ in the seed only
    smoke = plan_runs(Job(load_recipe("smoke"), None).compare_ladder(), None, "/nonexistent")
    assert sorted(r.name for r in smoke) == ["llama-s", "mamba-s", "mossnet-s"]  # one seed: the names it had
    # A ladder seed of its own is where the seeds start.
    ladder = S.seeded_ladder({"train": {"seed": 7}, "rungs": [{"name": "r", "model": {}, "tokens": 1}]}, 2)
    assert [(r["name"], r["train"]["seed"]) for r in ladder["rungs"]] == [("r-s0", 7), ("r-s1", 8)]


def test_a_recipe_starts_from_its_base_and_a_loop_of_bases_is_refused(tmp_path, monkeypatch):
    import yaml

    import linlm.reproduce.recipes as recipes

    long, cpu = load_recipe("cpu-long"), load_recipe("cpu")
    # cpu-long states only what it changes: the rest (NIAH, decode, the ladder's seeds) is cpu's.
    assert long.name == "cpu-long" and long.niah == cpu.niah and long.decode == cpu.decode and long.seeds == 3
    # ... but for the ladder's architectures: cpu trains the 2024 study's four, cpu-long every one of the ladder's.
    assert dataclasses.replace(long.scaling, archs=cpu.scaling.archs) == cpu.scaling and long.scaling.archs is None
    # cpu runs no MQAR (widths []) nor the studies on its task; cpu-long trains all three, with 5 seeds.
    assert (cpu.mqar.widths, cpu.mqar.configs(), cpu.aspect.shapes, cpu.context.gaps) == ([], [], [], [])
    assert long.mqar.widths == [64] and len(long.mqar.configs()) == 10 and long.mqar.task.num_kv == 16
    assert (long.mqar.seeds, long.aspect.seeds, long.context.seeds) == (5, 5, 5) and len(long.aspect.shapes) == 4
    assert long.compare.ladder["rungs"][0]["tokens"] == 2 * cpu.compare.ladder["rungs"][0]["tokens"]
    assert long.compare.ladder["train"] == cpu.compare.ladder["train"] and long.mossnet.ladder == "mossnet-cpu-long"
    assert "base" not in long.source() and long.source()["compare"]["seeds"] == 3
    # Every recipe that trains here compares with at least 3 seeds.
    for name in recipes.recipe_names():
        r = load_recipe(name)
        assert r.seeds >= 3 or name in ("smoke", "paper"), name
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "a.yaml").write_text(yaml.safe_dump({"base": "b", "name": "a"}))
    (folder / "b.yaml").write_text(yaml.safe_dump({"base": "a", "name": "b"}))
    (folder / "c.yaml").write_text(yaml.safe_dump({"base": "nosuch"}))
    monkeypatch.setattr(recipes, "RECIPE_DIR", folder)
    with pytest.raises(ConfigError, match="base: 'a'; name another recipe"):
        load_recipe("a")
    with pytest.raises(ConfigError, match="recipe c: base: unknown recipe 'nosuch'"):
        load_recipe("c")


@pytest.mark.parametrize("bad", [0, -1, 1.5, "three", True])
def test_a_seed_count_below_one_is_refused_before_any_work(bad, tmp_path, monkeypatch, capsys):
    import linlm.reproduce.recipes as recipes

    from linlm.schema import load_yaml

    folder = tmp_path / "recipes"
    shutil.copytree(recipes.RECIPE_DIR, folder)
    data = load_yaml(folder / "smoke.yaml")
    data["compare"]["seeds"] = bad
    import yaml

    (folder / "smoke.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(recipes, "RECIPE_DIR", folder)
    with pytest.raises(ConfigError, match="compare.seeds: give a whole number of training seeds from 1 to 100"):
        load_recipe("smoke")
    out = tmp_path / "job"
    assert main(["reproduce", "--recipe", "smoke", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "compare.seeds" in err
    assert not out.exists()


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])
def test_seeds_below_one_on_the_command_line_are_one_line_and_exit_2(dry, tmp_path, capsys):
    out = tmp_path / "job"
    assert main(["reproduce", "--recipe", "smoke", "--out", str(out), "--seeds", "0", *dry]) == 2
    err = capsys.readouterr().err.strip()
    # the parser's own refusal, with the range of the table (the same 1..100 the recipe's compare.seeds takes)
    assert err.splitlines() == [err] and "argument --seeds: expected a whole number from 1 to 100" in err
    assert "got '0'" in err and not out.exists()


def test_seeds_given_train_the_comparison_per_seed_and_are_kept_by_the_job(fakes, tmp_path):
    import json

    from linlm.reproduce import run

    out = tmp_path / "job"
    result = run("smoke", out, seeds=2, say=lambda text: None)
    assert not result["failed"]
    plan = json.loads((out / "compare" / "plan.json").read_text())
    assert sorted(plan["runs"]) == ["llama-s-s0", "llama-s-s1", "mamba-s-s0", "mamba-s-s1", "mossnet-s-s0",
                                    "mossnet-s-s1"]
    assert json.loads((out / "reproduce.json").read_text())["seeds"] == 2
    assert "with 2 seeds (train config seeds 0, 1)" in (out / "report.md").read_text()
    # The comparison has finished with 2 seeds: another count is refused, naming what it would change.
    with pytest.raises(ConfigError, match="--seeds: the job .* runs with --seeds 2.*compare"):
        run("smoke", out, seeds=3, say=lambda text: None)


def test_a_set_seed_is_refused_where_the_comparison_has_seeds(tmp_path, capsys):
    out = tmp_path / "job"
    assert main(["reproduce", "--recipe", "cpu", "--out", str(out), "--set", "seed=3"]) == 2
    err = capsys.readouterr().err
    assert "--set seed" in err and "3 seeds" in err and not out.exists()


def _niah(groups: dict, chance: float = 0.25, band: float = 0.29) -> dict:
    """A niah result: {label: (arch, group, mean)}."""
    return {"chance": chance, "scoring": "choice", "settings": {"mode": "easy", "scoring": "choice"},
            "models": {label: {"arch": a, "group": g, "mean": m, "weighted": m, "lengths": [80], "chance": chance,
                               "chance_band": band, "items": 400, "above_chance": m > band, "plot": "none.png",
                               "params": 1}
                       for label, (a, g, m) in groups.items()}}


def test_niah_at_chance_is_not_measurable_and_says_its_chance_level(tmp_path):
    from linlm.reproduce.sections.niah import render

    at_chance = _niah({"llama": ("llama", "llama", 0.26), "tnl": ("tnl", "tnl", 0.24),
                       "compare-llama-r-s0": ("llama", "compare-llama", 0.25)})
    job = SimpleNamespace(results={"niah": at_chance}, failures={}, waiting={}, plots=tmp_path)
    text = " ".join(str(b[1]) for b in render(job, []) if b[0] == "p")
    assert "Not measurable at this scale: every model is at chance (chance 0.250" in text
    # Above chance: the table says so, and no "not measurable".
    one = _niah({"llama": ("llama", "llama", 0.9), "tnl": ("tnl", "tnl", 0.3)})
    blocks = render(SimpleNamespace(results={"niah": one}, failures={}, waiting={}, plots=tmp_path), [])
    text = " ".join(str(b[1]) for b in blocks if b[0] == "p")
    assert "Not measurable" not in text
    table = next(b for b in blocks if b[0] == "table")
    assert [row[-1] for row in table[2]] == ["yes", "yes"]  # 0.9 and 0.3 are both above the 0.29 band
    # The paper's NIAH table: accuracy at or below each bound, mean, weighted and the penalised score.
    for m, (up_to, score) in zip(one["models"].values(), (({"80": 0.9}, 0.7), ({"80": 0.3}, 0.2))):
        m.update(up_to=up_to, score=score)
    table = next(b for b in render(SimpleNamespace(results={"niah": one}, failures={}, waiting={}, plots=tmp_path),
                                   []) if b[0] == "table")
    head = table[1]
    assert head[4:8] == ["acc <= 80", "mean", "weighted", "score"]
    assert [row[4] for row in table[2]] == ["0.900", "0.300"] and [row[7] for row in table[2]] == ["0.700", "0.200"]


def test_compare_quality_shows_the_spread_over_seeds():
    from linlm.reproduce.section import group_spreads
    from linlm.reproduce.sections.quality import COMPARE_QUALITY

    models = {f"{a}-r-s{i}": {"arch": a, "group": a, "params": 1000, "tokens": 10, "train_loss": 3.0,
                              "val_loss": v + 0.01 * i, "bits_per_byte": 1.0, "token_perplexity": 20.0,
                              "scored_tokens": 100} for a, v in (("llama", 3.2), ("mossnet", 3.0)) for i in range(3)}
    result = {"models": models, "max_tokens": 100, "spread": group_spreads(models, "val_loss")}
    assert result["spread"]["llama"]["n"] == 3 and result["spread"]["llama"]["mean"] == pytest.approx(3.21)
    blocks = COMPARE_QUALITY.render(SimpleNamespace(results={"compare_quality": result}, failures={}, waiting={}), [])
    spread = [b for b in blocks if b[0] == "table" and b[1][:2] == ["model", "seeds"]]
    assert spread and spread[0][2][0][:3] == ["llama", "3", "3.2100"]
    assert "sample standard deviation" in " ".join(str(b[1]) for b in blocks if b[0] == "p")


def test_zeroshot_scores_every_seed_of_the_comparison_and_shows_their_spread(tmp_path, monkeypatch):
    from pathlib import Path
    from types import SimpleNamespace

    import linlm.eval.evaluator
    import linlm.infer.generate
    from reproduce_helpers import MODEL, fake_zeroshot_models, task_dir

    from linlm.reproduce import section
    from linlm.reproduce.sections import zeroshot

    fake_zeroshot_models(monkeypatch)
    score = {"/ckpt/llama": 0.40, "/ckpt/s0": 0.50, "/ckpt/s1": 0.56, "/ckpt/s2": 0.53}
    seen = []

    def evaluate(model, tok, names, root, **kw):
        acc = score[seen[-1]]
        return {"tasks": {names[0]: {"metric": "acc", "acc": acc, "acc_norm": acc, "acc_stderr": 0.1,
                                     "acc_norm_stderr": 0.1, "n": 4}}}

    def load(ckpt, *a, **k):
        seen.append(ckpt)
        return None, None

    monkeypatch.setattr(linlm.eval.evaluator, "evaluate", evaluate)
    monkeypatch.setattr(linlm.infer.generate, "load_for_generation", load)

    def trained(sweep, largest_only):
        if Path(sweep).name == "scaling":
            return {"llama": {**MODEL, "checkpoint": "/ckpt/llama"}}
        runs = {f"llama-r-s{i}": {**MODEL, "seed": i, "checkpoint": f"/ckpt/s{i}"} for i in range(3)}
        return dict(list(runs.items())[:1]) if largest_only else runs

    monkeypatch.setattr(section, "trained_models", trained)
    from linlm.eval.tasks import COMMONSENSE, TASKS

    from linlm.reproduce.sections.zeroshot import ZeroshotSettings

    tasks = task_dir(tmp_path / "tasks", "x")
    for name in COMMONSENSE:
        (tasks / TASKS[name].filename).write_text("x\n")
    job = SimpleNamespace(sweep=lambda name: tmp_path / name, data_dir=str(tasks), results={}, failures={},
                          recipe=SimpleNamespace(zeroshot=ZeroshotSettings(limit=4)), waiting={})
    z = zeroshot.run(job, lambda f: None)
    assert sorted(z["models"]) == ["compare-llama-r-s0", "compare-llama-r-s1", "compare-llama-r-s2", "llama"]
    spread = z["spread"]["compare-llama"]
    assert spread["n"] == 3 and abs(spread["mean"] - 0.53) < 1e-9 and (spread["min"], spread["max"]) == (0.5, 0.56)
    assert z["spread"]["llama"]["n"] == 1
    job.results = {"zeroshot": z}
    tables = [b for b in zeroshot.render(job, []) if b[0] == "table"]
    assert ["compare-llama", "3", "0.530", "0.030", "0.500", "0.560"] in tables[-1][2]


def test_the_report_says_what_the_recipes_size_gives_up():
    from linlm.reproduce.report import tradeoff_blocks
    from linlm.reproduce.sections import SECTIONS

    names = {s.name for s in SECTIONS} | {s.key for s in SECTIONS if s.key}
    for recipe in ("cpu", "cpu-long"):
        r = load_recipe(recipe)
        assert set(r.tradeoffs) <= names, set(r.tradeoffs) - names  # each names a section of the report
        (table,) = [b for b in tradeoff_blocks(r) if b[0] == "table"]
        assert [row[0] for row in table[2]] == list(r.tradeoffs)
    long = load_recipe("cpu-long").tradeoffs
    assert "2M tokens" in long["compare"] and "0.25" in long["niah"]  # its own compare, the cpu recipe's NIAH
    assert tradeoff_blocks(load_recipe("smoke")) == []


def test_a_set_seed_is_refused_where_a_ladder_has_seed_rungs(tmp_path, capsys):
    """With --seeds 1 the comparison takes a --set seed, but the cpu sweep's seed rungs (RUNG-s1) would all get
    that one seed: trained for hours, then refused by the fits as copies of their first seed."""
    out = tmp_path / "job"
    assert main(["reproduce", "--recipe", "cpu", "--out", str(out), "--seeds", "1", "--set", "seed=3",
                 "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("linlm: error: --set seed") and err.count("\n") == 1, err
    assert "gives rungs seeds of their own" in err and "-s1" in err and not out.exists()
