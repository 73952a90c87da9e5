"""linlm reproduce: the smoke recipe end to end and resumed, the directory rules, the dry-run plan, the recipes'
comparisons at equal active size, and claims whose verdicts follow the numbers."""

from __future__ import annotations

import json
import time

import pytest

from linlm.cli import main
from linlm.errors import ConfigError
from linlm.reproduce import claims as C
from linlm import outputs
from linlm.reproduce import run
from linlm.reproduce.layout import FORMAT, MARKER, check_directory
from linlm.reproduce.recipes import load_recipe, recipe_names
from linlm.reproduce.sections import SECTIONS
from linlm.train import checkpoint as ckpt
from output_asserts import assert_png

VERDICTS = {"for", "against", "alike", "mixed", "cannot tell"}


def count_train_steps(monkeypatch) -> list[int]:
    """Every optimizer step any trainer of this process takes is counted in the one-element list returned
    (the scaling sweep, the comparison and the MQAR runs all train in this process)."""
    from linlm.train.step import TrainStep

    taken = [0]
    real = TrainStep.__call__

    def counted(self, *args, **kwargs):
        taken[0] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TrainStep, "__call__", counted)
    return taken


def written_by_the_sections(out) -> dict:
    """Each section's stored result and every file a training run writes (metrics, summaries, weights), with its
    bytes and modification time: what a rerun that reads everything back must leave as it is."""
    kept = {"metrics.jsonl", "summary.json", "scaling.json"}
    return {str(p.relative_to(out)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(out.rglob("*"))
            if p.is_file() and (p.parent.name == "sections" or p.name in kept or p.suffix == ".safetensors")}


def panels_size(n: int) -> tuple[int, int]:
    """The pixel size of the scaling report's loss-against-compute figure for n architectures: one 6.2 x 4.2 inch
    panel each, two to a row, at 110 dpi."""
    return round(6.2 * min(n, 2) * 110), round(4.2 * -(-n // 2) * 110)


def test_smoke_recipe_end_to_end_then_resumed(tmp_path, text_file, monkeypatch):
    out = tmp_path / "job"
    said: list[str] = []
    steps = count_train_steps(monkeypatch)
    result = run("smoke", out, overrides={"data": {"source": str(text_file)}}, say=said.append)
    assert not result["pending"] and not result["failed"], (result["pending"], result["failed"])
    assert steps[0] > 0, "the counter saw no training step: it counts nothing"
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    # Every claim is judged, with a verdict from the fixed vocabulary, what it is judged by and the paper's terms.
    assert [c.claim for c in result["claims"]] == [c.claim for c in C.judge({})]
    assert all(c.verdict in VERDICTS for c in result["claims"])
    for c in result["claims"]:
        assert c.difference in md and c.terms in md and c.verdict in md
        assert c.verdict != "cannot tell" or c.why in md  # never a verdict it cannot support, and why not
    # Each section ran and is in the report: tables and plots, provenance, and the skipped zero-shot section.
    for name in ("scaling", "compare", "fits", "quality", "compare_quality", "niah", "mqar", "decode"):
        assert (out / "sections" / f"{name}.json").is_file(), name
    assert not (out / "sections" / "zeroshot.json").exists()  # skipped sections run again next time
    assert "Skipped: no --data-dir was given" in md
    # What the job and its sweep wrote is linlm's by the ledgers (what --overwrite may remove, and nothing else).
    for rel in (MARKER, "report.md", "report.html", "results.json", "sections/fits.json",
                "plots/loss_vs_compute.png", "scaling/plan.json", "scaling/runs/tnl-s/scaling.json"):
        assert outputs.owns_file(out / rel), rel
    assert outputs.owns_dir(out / "scaling" / "runs" / "tnl-s") and outputs.owns_dir(out / "sections")
    # Every plot is in both pages (inlined once in the HTML) and is a picture of its figure's size with something
    # drawn (figure inches x dpi, in pixels); the NIAH heatmaps, one per model, are 5 x 4 inches at 120 dpi.
    archs = json.loads((out / "scaling" / "plan.json").read_text())["archs"]
    sizes = {"loss_vs_compute.png": panels_size(len(archs)), "mqar.png": (1200, 480), "decode.png": (1320, 480)}
    plots = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert set(sizes) <= set(plots) and all(p in sizes or p.startswith("niah_") for p in plots), plots
    assert html.count("data:image/png;base64,") == len(plots)
    for png in plots:
        assert_png(out / "plots" / png, sizes.get(png, (600, 480)))
        assert f"plots/{png}" in md
    assert "git revision" in md and "torch" in md and '"ladder": "smoke"' in md
    # MossNet's decode state is measured at two contexts and the constant-memory verdict follows from it.
    decode = json.loads((out / "sections" / "decode.json").read_text())
    moss = [r["state_bytes"] for r in decode["rows"] if r["arch"] == "mossnet"]
    memory = next(c for c in result["claims"] if c.key == "constant-memory")
    assert len(moss) == 2 and memory.verdict == ("for" if moss[1] <= 1.01 * moss[0] else "against")
    names = [s.name for s in SECTIONS]
    n = len(names)
    assert any(f"[1/{n}] scaling" in s for s in said) and any(f"[{names.index('decode') + 1}/{n}] decode" in s
                                                                for s in said)
    # The retrieval studies ran (a table per study, with every run: its learning rate and whether it plateaued);
    # the smoke recipe names no MossNet ladder: that section says so and trains nothing.
    for study in ("aspect", "context"):
        res = json.loads((out / "sections" / f"{study}.json").read_text())
        assert {r["arch"] for r in res["runs"]} == {"llama", "cosformer2"} and len(res["levels"]) == 2
        assert all(r["steps"] == 8 and isinstance(r["plateaued"], bool) for r in res["runs"])
    assert "Shape: aspect ratio (retrieval)" in md and "| plateaued |" in md
    mqar = json.loads((out / "sections" / "mqar.json").read_text())
    assert set(mqar["lr_sweep"]) == {c["name"] for c in mqar["rows"]} and "mossnet-E1-wide-d16" in mqar["lr_sweep"]
    assert all(r["lr"] == mqar["lr_sweep"][r["name"]]["chosen"] for r in mqar["runs"])
    assert "Skipped: recipe smoke gives no mossnet ladder" in md and not (out / "mossnet").exists()
    # Downstream against compute: each run kept steps 1 and its last (keep_log 2); the kept one is model-only, and
    # both are placed at their training compute, which grows with the step. No --data-dir, and a 32-token context
    # too short for a needle: nothing to score, and the report says why (the scoring: tests/scaling).
    down = json.loads((out / "sections" / "downstream.json").read_text())
    runs = {r.name for r in (out / "scaling" / "runs").iterdir() if r.is_dir()}
    assert {p["run"] for p in down["points"]} == runs and len(down["points"]) == 2 * len(runs)
    assert all("too short for the needle" in p["niah_skipped"] and "lambada_ppl" not in p for p in down["points"])
    for run_name in runs:
        first, last = sorted((p for p in down["points"] if p["run"] == run_name), key=lambda p: p["step"])
        assert first["step"] == 1 and last["compute_pflops_days"] == pytest.approx(
            first["compute_pflops_days"] * last["step"])
        ckpts = dict(ckpt.list_checkpoints(out / "scaling" / "runs" / run_name / "checkpoints"))
        assert ckpt.is_model_only(ckpts[1]) and not ckpt.is_model_only(ckpts[last["step"]])
    assert "Downstream scores against compute" in md and "NIAH was not measured at some checkpoints" in md

    # The same command again: every finished section is read back; no optimizer step is taken, and no section's
    # result or training file is written again.
    said.clear()
    steps[0] = 0
    before = written_by_the_sections(out)
    assert any(k.startswith("sections/") for k in before) and any(k.endswith(".safetensors") for k in before)
    again = run("smoke", out, overrides={"data": {"source": str(text_file)}}, say=said.append)
    assert steps[0] == 0
    assert written_by_the_sections(out) == before
    assert not any("training" in s for s in said)
    assert [c.verdict for c in again["claims"]] == [c.verdict for c in result["claims"]]


def test_sigint_during_the_sweep_stops_the_job_as_interrupted(tmp_path, text_file):
    """One SIGINT to a real `linlm reproduce` while its scaling sweep trains: exit 130, said so, and neither the
    section nor a report that would read as done is saved; the rerun continues the sweep."""
    import signal
    import subprocess
    import sys

    from reproduce_helpers import cli_env

    out = tmp_path / "job"
    proc = subprocess.Popen([sys.executable, "-m", "linlm", "reproduce", "--recipe", "smoke", "--out", str(out),
                             "--set", f"data.source={text_file}"], env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    metrics = out / "scaling" / "runs" / "llama-xs" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.is_file() and metrics.stat().st_size > 0):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, text
    assert "interrupted" in text and "Traceback" not in text
    assert not (out / "sections" / "scaling.json").exists() and not (out / "report.md").exists()
    assert (out / MARKER).is_file()


@pytest.mark.parametrize("flag", ["--recipe", "--preset"])  # --preset: the flag's old spelling
def test_unknown_recipe_lists_the_valid_ones(tmp_path, capsys, flag):
    assert main(["reproduce", flag, "laptop", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "--recipe: unknown recipe 'laptop'" in err and all(repr(p) in err for p in ("cpu", "gpu", "paper", "smoke"))
    assert not (tmp_path / "x").exists()


def test_directory_rules(tmp_path):
    smoke = load_recipe("smoke")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("mine")
    for flags in ({}, {"resume": True}, {"overwrite": True}):
        with pytest.raises(ConfigError, match="did not write"):
            check_directory(foreign, smoke, resume=flags.get("resume", False), overwrite=flags.get("overwrite", False))
    assert (foreign / "thesis.tex").read_text() == "mine"

    import linlm

    other = tmp_path / "other"
    outputs.write_json(other / MARKER, {"format": FORMAT, "preset": "cpu", "version": linlm.__version__})
    with pytest.raises(ConfigError, match="recipe 'cpu'.*--resume.*--overwrite"):
        check_directory(other, smoke, resume=False, overwrite=False)
    recipe, marker = check_directory(other, smoke, resume=True, overwrite=False)
    assert recipe.name == "cpu" and marker["preset"] == "cpu"  # --resume continues the directory's own job
    recipe, _ = check_directory(other, smoke, resume=False, overwrite=True)
    assert recipe.name == "smoke"
    with pytest.raises(ConfigError, match="no reproduce job to resume"):
        check_directory(tmp_path / "empty", smoke, resume=True, overwrite=False)
    # A marker the user wrote (or edited) is not a job of linlm's.
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / MARKER).write_text(json.dumps({"format": FORMAT, "preset": "smoke"}))
    with pytest.raises(ConfigError, match="did not write|not written by linlm"):
        check_directory(tmp_path / "fake", smoke, resume=True, overwrite=False)


def test_paper_dry_run_prints_the_plan_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "paper"
    assert main(["reproduce", "--recipe", "paper", "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "llama-7b" in text and "mossnet-410m" in text and "PFLOP/s-days" in text and "GPU-hours" in text
    from linlm.models.registry import arch_names

    # The paper ladder: 6 sizes of every architecture of the scaling study; MossNet's comparison at 410M: 3 runs.
    assert f"{6 * len(arch_names(scaling_study=True)) + 3} training runs" in text
    assert not (out / MARKER).exists() and not (out / "torchrun.sh").exists()


@pytest.mark.parametrize("name", ["smoke", "cpu", "gpu"])
def test_comparison_is_at_equal_active_parameters(name):
    from linlm.reproduce.job import Job
    from linlm.scaling.ladder import plan_runs

    runs = plan_runs(Job(load_recipe(name), None).compare_ladder(), None, "/nonexistent")
    params = {r.arch: r.params for r in runs}
    assert set(params) == {"llama", "mamba", "mossnet"}
    assert all(abs(n / params["llama"] - 1) < 0.05 for n in params.values()), params  # within 5 % of LLaMA
    assert len({r.tokens for r in runs}) == 1


def test_every_preset_loads():
    assert set(recipe_names()) == {"smoke", "cpu", "cpu-long", "gpu", "paper"}
    presets = {name: load_recipe(name) for name in recipe_names()}
    # Only the paper's preset is too big to train here: it writes torchrun commands for a cluster.
    assert {n: p.mode for n, p in presets.items()} == {"smoke": "local", "cpu": "local", "cpu-long": "local",
                                                       "gpu": "local", "paper": "torchrun"}
    assert all(p.scaling.ladder for p in presets.values())


def test_zeroshot_table_renders_scores_and_the_unscored_tasks():
    from types import SimpleNamespace

    from linlm.eval.tasks import COMMONSENSE, commonsense_average
    from linlm.reproduce.sections.zeroshot import render as zeroshot_blocks

    tasks = {t: {"metric": "acc", "acc": 0.5, "acc_stderr": 0.01, "acc_norm": 0.5, "acc_norm_stderr": 0.01}
             for t in COMMONSENSE}
    partial = {t: v for t, v in tasks.items() if t != "piqa"}
    z = {"data_dir": "d", "limit": 10, "missing_tasks": [], "not_scored": {"piqa": "a continuation is too long"},
         "models": {"a": {"tasks": tasks, "commonsense_avg": commonsense_average(tasks)},
                    "b": {"tasks": partial, "commonsense_avg": commonsense_average(partial)}}}
    blocks = zeroshot_blocks(SimpleNamespace(results={"zeroshot": z}, failures={}, waiting={}), [])
    table = next(b for b in blocks if b[0] == "table")
    assert table[2][0][-1] == "0.500" and table[2][1][-1] == "-"
    assert table[1][1] == "arc_challenge (acc)" and len(table[1]) == 9  # the 7 columns with their metrics
    assert any(b[0] == "p" and "piqa was not scored" in b[1] for b in blocks)
    assert sum(b[0] == "table" for b in blocks) == 1  # no perplexity scored, no perplexity table
    # LAMBADA and WikiText-2: a perplexity table of their own, not columns of the commonsense one.
    z["models"]["a"]["tasks"] = {**tasks, "lambada": {"metric": "acc", "acc": 0.25, "perplexity": 812.5},
                                 "wikitext2": {"metric": "word_perplexity", "word_perplexity": 1234.5,
                                               "byte_perplexity": 3.25, "bits_per_byte": 1.7004}}
    tables = [b for b in zeroshot_blocks(SimpleNamespace(results={"zeroshot": z}, failures={}, waiting={}), [])
              if b[0] == "table"]
    assert len(tables[0][1]) == 9
    assert tables[1][1] == ["model", "WikiText-2 word ppl", "WikiText-2 byte ppl", "WikiText-2 bits/byte",
                            "LAMBADA ppl", "LAMBADA acc"]
    assert tables[1][2] == [["a", "1234.50", "3.2500", "1.7004", "812.50", "0.250"], ["b", "-", "-", "-", "-", "-"]]


def test_long_context_section_renders_lm_evals_metrics_and_the_cut(monkeypatch):
    from types import SimpleNamespace

    from linlm.errors import ConfigError
    from linlm.eval.long_tasks import SCROLLS_METRICS
    from linlm.reproduce.sections.long_context import LongContextSettings, render, run

    assert LongContextSettings(tasks=["scrolls", "swde"]).validate().names()[-1] == "swde"
    with pytest.raises(ConfigError, match="piqa are not long-context tasks"):
        LongContextSettings(tasks="piqa").validate()
    job = SimpleNamespace(recipe=SimpleNamespace(long_context=LongContextSettings()))
    assert "lists no long-context tasks" in run(job, lambda f: None)["not_run"]
    # With the sweep's models at hand, a recipe listing none says what the tasks could say at its scale.
    import linlm.reproduce.sections.long_context as lc

    for ctx, said in ((128, True), (1024, False)):
        monkeypatch.setattr(lc, "largest_models", lambda job, *s, c=ctx: {"llama": {"seq_len": c}, "tnl": {}})
        why = run(SimpleNamespace(recipe=job.recipe, sweep=None), lambda f: None)["not_run"]
        assert ("trained on 128-token contexts" in why and "could order" in why) is said, why
    tasks = {t: {m: 0.0 for m in ms} for t, ms in SCROLLS_METRICS.items()}
    r = {"tasks": list(SCROLLS_METRICS), "limit": 5,
         "models": {"tnl": {"arch": "tnl", "params": 1, "tasks": tasks, "scrolls_avg": 0.0,
                            "cut": {"window": 128, "requests": 35, "cut": 30, "longest_input": 9000}}}}
    blocks = render(SimpleNamespace(results={"long_context": r}, failures={}, waiting={}), [])
    table = next(b for b in blocks if b[0] == "table")
    assert len(table[1]) == 1 + 13 + 2 and table[1][1] == "govreport rouge1"
    assert table[2][0][-2:] == ["0.00", "30/35 to 128"]
    assert any(b[0] == "p" and "every model scores 0" in b[1] for b in blocks)
