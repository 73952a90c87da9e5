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
from output_asserts import assert_png

VERDICTS = {"supported", "partly supported", "not supported", "tie", "one seed: no spread",
            "not supported at this scale", "not measured"}


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
    # Every claim is judged, with a verdict from the fixed vocabulary and its rule shown.
    assert [c.claim for c in result["claims"]] == [c.claim for c in C.judge({})]
    assert all(c.verdict in VERDICTS for c in result["claims"])
    for c in result["claims"]:
        assert c.rule in md and c.verdict in md
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
    assert len(moss) == 2 and C.constant_memory_decode(decode).verdict == (
        "supported" if moss[1] <= C.CONSTANT_STATE * moss[0] else "not supported")
    names = [s.name for s in SECTIONS]
    n = len(names)
    assert any(f"[1/{n}] scaling" in s for s in said) and any(f"[{names.index('decode') + 1}/{n}] decode" in s
                                                                for s in said)
    # The smoke recipe names no study: those sections say so, and train nothing.
    assert "Skipped: recipe smoke gives no aspect ladder" in md and not (out / "aspect").exists()

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
    assert "27 training runs" in text
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


# ---- claims: the verdict follows the numbers ----------------------------------------------------------------------


def _fits(alphas: dict, r2: float = 0.95, c_max: float = 1e-6, alpha_hw: float = 0.005,
          beta_rel: float = 0.002) -> dict:
    """Fits of L(C) = beta C^alpha per architecture, with 95 % intervals of half-width ``alpha_hw`` around alpha and
    of relative half-width ``beta_rel`` around beta (the keys the fits section writes)."""
    return {"archs": {a: {"envelope": {"L(C)": {"alpha": al, "beta": b, "r2": r2,
                                                "alpha_ci": [al - alpha_hw, al + alpha_hw],
                                                "beta_ci": [b * (1 - beta_rel), b * (1 + beta_rel)]},
                                       "envelope": {"compute_pflops_days": [c_max / 10, c_max]}}}
                      for a, (al, b) in alphas.items()}}


def test_scaling_claims_follow_the_fits():
    same = _fits({"llama": (-0.08, 3.0), "tnl": (-0.075, 2.9), "hgrn2": (-0.085, 2.8), "cosformer2": (-0.07, 2.9)})
    assert C.scale_like_transformers(same).verdict == "supported"
    apart = _fits({"llama": (-0.08, 3.0), "tnl": (-0.2, 2.9), "hgrn2": (-0.085, 2.8), "cosformer2": (-0.02, 2.9)})
    assert C.scale_like_transformers(apart).verdict == "partly supported"
    # The same exponents with intervals too wide to have seen a 25 % difference: the fit cannot tell.
    wide = _fits({"llama": (-0.08, 3.0), "tnl": (-0.075, 2.9), "hgrn2": (-0.085, 2.8), "cosformer2": (-0.07, 2.9)},
                 alpha_hw=0.05)
    assert C.scale_like_transformers(wide).verdict == "not supported at this scale"
    one_wide = _fits({"llama": (-0.08, 3.0), "tnl": (-0.075, 2.9), "hgrn2": (-0.085, 2.8)})
    one_wide["archs"]["tnl"]["envelope"]["L(C)"]["alpha_ci"] = [-0.125, -0.025]
    claim = C.scale_like_transformers(one_wide)  # the undecided one is left out of the tally
    assert claim.verdict == "supported" and "tnl alpha -0.0750 [-0.1250, -0.0250]: overlaps, but" in claim.evidence
    # Exponents 20 % apart whose intervals are disjoint scale otherwise, whatever the 25 % band would say.
    tight = _fits({"llama": (-0.08, 3.0), "tnl": (-0.064, 2.9)}, alpha_hw=0.001)
    assert "disjoint" in C.scale_like_transformers(tight).evidence
    assert C.scale_like_transformers(tight).verdict == "not supported"
    assert C.scale_like_transformers(_fits({"llama": (-0.08, 3.0)}, r2=0.3)).verdict == "not supported at this scale"
    assert C.scale_like_transformers(None).verdict == "not measured"
    # Equal compute: beta decides at a common C when the exponents match, beyond the intervals' box.
    lower = _fits({"llama": (-0.08, 3.0), "tnl": (-0.08, 2.9), "hgrn2": (-0.08, 2.8), "cosformer2": (-0.08, 2.9)},
                  alpha_hw=0.0005)
    assert C.lower_loss_at_equal_compute(lower).verdict == "supported"
    higher = _fits({"llama": (-0.08, 2.8), "tnl": (-0.08, 2.9), "hgrn2": (-0.08, 3.0), "cosformer2": (-0.08, 2.9)},
                   alpha_hw=0.0005)
    claim = C.lower_loss_at_equal_compute(higher)
    assert claim.verdict == "not supported" and f"{C.LOSS_MARGIN}" in claim.rule
    # The same betas with exponents uncertain enough that the bounds at C overlap: every difference is a tie.
    unsure = _fits({"llama": (-0.08, 3.0), "tnl": (-0.08, 2.9), "hgrn2": (-0.08, 2.8), "cosformer2": (-0.08, 2.9)},
                   alpha_hw=0.02)
    assert C.lower_loss_at_equal_compute(unsure).verdict == "tie"


def _mqar(acc: dict, chance: float = 0.01, spread: float = 0.005, seeds: int = 3) -> dict:
    """An MQAR result: {arch: mean accuracy at d=64}, each seed ``spread`` apart around it (d=32 all at 0)."""
    offsets = [spread * (i - (seeds - 1) / 2) for i in range(seeds)]
    runs = [{"name": f"{a}-d64", "d_model": 64, "seed": i, "accuracy": v + o}
            for a, v in acc.items() for i, o in enumerate(offsets)]
    runs += [{"name": f"{a}-d32", "d_model": 32, "seed": i, "accuracy": 0.0} for a in acc for i in range(seeds)]
    rows = [{"name": f"{a}-d64", "d_model": 64, "accuracy": v} for a, v in acc.items()]
    return {"chance": chance, "runs": runs, "rows": rows + [{"name": f"{a}-d32", "d_model": 32, "accuracy": 0.0}
                                                           for a in acc]}


def test_retrieval_claims_follow_mqar():
    strong_llama = _mqar({"llama": 0.9, "tnl": 0.2, "hgrn2": 0.6, "cosformer2": 0.1})
    assert C.weaker_at_retrieval(strong_llama, None).verdict == "supported"
    assert C.decay_helps_retrieval(strong_llama).verdict == "supported"
    even = _mqar({"llama": 0.5, "tnl": 0.5, "hgrn2": 0.52, "cosformer2": 0.49})  # within the margin: ties
    assert C.weaker_at_retrieval(even, None).verdict == "tie"
    assert C.decay_helps_retrieval(even).verdict == "tie"
    reversed_ = _mqar({"llama": 0.3, "tnl": 0.6, "hgrn2": 0.25, "cosformer2": 0.7})
    assert C.weaker_at_retrieval(reversed_, None).verdict == "not supported"
    assert C.decay_helps_retrieval(reversed_).verdict == "not supported"
    chance = _mqar({"llama": 0.02, "tnl": 0.01, "hgrn2": 0.012, "cosformer2": 0.01})
    assert C.weaker_at_retrieval(chance, None).verdict == "not supported at this scale"
    assert C.decay_helps_retrieval(chance).verdict == "not supported at this scale"


def test_retrieval_claims_count_a_difference_only_beyond_the_seed_spread():
    # 0.2 apart in the means, but the seeds' ranges overlap (spread 0.5): every difference is a tie.
    wide = _mqar({"llama": 0.6, "tnl": 0.4, "hgrn2": 0.6, "cosformer2": 0.4}, spread=0.25)
    claim = C.weaker_at_retrieval(wide, None)
    assert claim.verdict == "tie" and "llama 0.600 ± 0.250 [0.350, 0.850] (3 seeds)" in claim.evidence
    assert "tnl 0.400 ± 0.250" in claim.evidence and "llama tie" in claim.evidence
    assert C.decay_helps_retrieval(wide).verdict == "tie"
    # The same means with the ranges apart: LLaMA above tnl and cosformer2, not hgrn2 (equal).
    apart = _mqar({"llama": 0.6, "tnl": 0.4, "hgrn2": 0.6, "cosformer2": 0.4}, spread=0.05)
    assert C.weaker_at_retrieval(apart, None).verdict == "partly supported"
    assert C.decay_helps_retrieval(apart).verdict == "supported"
    # One seed each: however large the difference, none counts.
    one = _mqar({"llama": 0.9, "tnl": 0.1, "hgrn2": 0.6, "cosformer2": 0.1}, seeds=1)
    claim = C.weaker_at_retrieval(one, None)
    assert claim.verdict == "one seed: no spread" and "(one seed)" in claim.evidence
    assert C.decay_helps_retrieval(one).verdict == "one seed: no spread"
    # A result that kept only the configurations' means (no runs) is one value each: no spread either.
    means_only = {k: v for k, v in _mqar({"llama": 0.9, "tnl": 0.1}).items() if k != "runs"}
    assert C.weaker_at_retrieval(means_only, None).verdict == "one seed: no spread"
    assert "ranges over seeds do not overlap" in claim.rule


def seeded_quality(losses: dict) -> dict:
    """A compare_quality result: {arch: [val loss of each seed]} as its runs ARCH-r-sI."""
    return {"models": {f"{a}-r-s{i}": {"arch": a, "seed": i, "val_loss": v, "bits_per_byte": v / 2, "params": 1000}
                       for a, vs in losses.items() for i, v in enumerate(vs)}}


def test_mossnet_claims_follow_the_numbers():
    def q(moss, llama, mamba, spread=0.005):
        return seeded_quality({a: [v - spread, v, v + spread]
                               for a, v in (("mossnet", moss), ("llama", llama), ("mamba", mamba))})

    assert C.mossnet_beats_baselines(q(3.0, 3.2, 3.1)).verdict == "supported"
    assert C.mossnet_beats_baselines(q(3.0, 3.2, 2.9)).verdict == "partly supported"
    assert C.mossnet_beats_baselines(q(3.3, 3.2, 3.4)).verdict == "partly supported"
    assert C.mossnet_beats_baselines(q(3.3, 3.2, 3.1)).verdict == "not supported"
    assert C.mossnet_beats_baselines(q(3.195, 3.2, 3.2, spread=0.001)).verdict == "tie"  # within the margin
    # 0.1 nats apart, but the seeds' ranges overlap: within the seed spread, a tie.
    assert C.mossnet_beats_baselines(q(3.0, 3.1, 3.1, spread=0.08)).verdict == "tie"
    # One seed each: no spread, so no difference counts, however large.
    one = seeded_quality({"mossnet": [3.0], "llama": [3.5], "mamba": [3.5]})
    assert C.mossnet_beats_baselines(one).verdict == "one seed: no spread"
    rows = [{"arch": "mossnet", "context": n, "state_bytes": s} for n, s in ((16, 100), (64, 100))]
    assert C.constant_memory_decode({"rows": rows}).verdict == "supported"
    rows[1]["state_bytes"] = 400
    assert C.constant_memory_decode({"rows": rows}).verdict == "not supported"


def test_claims_take_their_architectures_from_the_registry(monkeypatch):
    """A linear-attention architecture of the scaling study registered beside the others is judged with them, and
    the baseline is the registry's."""
    import dataclasses

    from linlm.models.registry import ARCHITECTURES

    monkeypatch.setitem(ARCHITECTURES, "toy", dataclasses.replace(ARCHITECTURES["tnl"], name="toy"))
    four = {"llama": (-0.08, 3.0), "tnl": (-0.075, 2.9), "hgrn2": (-0.085, 2.8), "cosformer2": (-0.07, 2.9)}
    claim = C.scale_like_transformers(_fits(four))
    assert "toy: no fit" in claim.evidence and claim.verdict == "supported"
    assert C.scale_like_transformers(_fits({**four, "toy": (-0.3, 2.9)})).verdict == "partly supported"
    assert C.weaker_at_retrieval(_mqar({"llama": 0.9, "tnl": 0.2, "hgrn2": 0.6, "cosformer2": 0.1, "toy": 0.95}),
                                 None).verdict == "partly supported"
    monkeypatch.setitem(ARCHITECTURES, "toy", dataclasses.replace(ARCHITECTURES["tnl"], name="toy",
                                                                  scaling_study=False))
    assert C.scale_like_transformers(_fits({**four, "toy": (-0.3, 2.9)})).verdict == "supported"  # not the study's
    # MossNet's baselines: the registry's baseline and every SSM.
    monkeypatch.setitem(ARCHITECTURES, "toyssm", dataclasses.replace(ARCHITECTURES["mamba"], name="toyssm"))
    losses = {"mossnet": 3.0, "llama": 3.2, "mamba": 3.1, "toyssm": 2.9}
    claim = C.mossnet_beats_baselines(seeded_quality({a: [v, v + 0.001, v + 0.002] for a, v in losses.items()}))
    assert claim.verdict == "partly supported" and "toyssm 2.9010" in claim.evidence
    # The baseline is whichever the registry names.
    from linlm.models import registry

    monkeypatch.setattr(registry, "baseline_arch", lambda: "mamba")
    assert C.weaker_at_retrieval(_mqar({"llama": 0.9, "mamba": 0.1}), None).evidence.startswith("MQAR d=64: mamba")


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
    assert any(b[0] == "p" and "piqa was not scored" in b[1] for b in blocks)
