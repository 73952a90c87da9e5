"""The studies of a recipe: MossNet's optional ladder (trained and fitted for real on a tiny ladder, skipped when the
recipe names none) and the retrieval studies' settings (shapes of at least 3 layers, two contexts or more), refused
in one line before any work."""

from __future__ import annotations

import pytest

from linlm.reproduce.job import Job
from linlm.reproduce.recipes import load_recipe
from linlm.reproduce.sections import mossnet_ladder as shape
from linlm.schema import load_yaml
from linlm.scaling.ladder import LADDER_DIR


def inline(name: str, archs: list[str]) -> dict:
    """A built-in ladder as a recipe's inline mapping, with other architectures."""
    return {"ladder": {**load_yaml(LADDER_DIR / f"{name}.yaml"), "archs": archs}}


def test_mossnet_s_ladder_trains_fits_and_renders(tmp_path, text_file):
    recipe = load_recipe("smoke").with_settings(mossnet=inline("mossnet-smoke", ["mossnet"]),
                                                fits={"bootstrap": 10, "parametric_bootstrap": 0})
    job = Job(recipe, tmp_path / "job", overrides={"data": {"source": str(text_file)}}, say=lambda s: None)
    job.plots.mkdir(parents=True)
    for section in (shape.MOSSNET, shape.MOSSNET_FITS):
        section.check(job, lambda key: "", False) if section.check else None
        job.results[section.name] = section.run(job, lambda f: None)
    # The MossNet ladder is fitted as the scaling sweep is; its report lands in DIR/mossnet_report.
    fits = job.results["mossnet_fits"]
    assert set(fits["archs"]) == {"mossnet"} and (tmp_path / "job" / "mossnet_report" / "report.md").is_file()
    assert any(b[0] == "table" for b in shape.MOSSNET_FITS.render(job, []))


def test_a_recipe_without_a_study_skips_it_and_says_so(tmp_path):
    job = Job(load_recipe("smoke"), tmp_path / "job")
    for section in (shape.MOSSNET, shape.MOSSNET_FITS):
        section.check(job, lambda key: "", False) if section.check else None
        job.results[section.name] = section.run(job, lambda f: None)
        assert "gives no" in job.results[section.name]["not_run"]
    assert ("p", f"Skipped: {job.results['mossnet_fits']['not_run']}.") in shape.MOSSNET_FITS.render(job, [])
    from linlm.reproduce.claims import judge

    scales = next(v for v in judge(job.results) if v.key == "mossnet-scales")
    assert scales.verdict == "cannot tell" and "gives no mossnet ladder" in scales.why
    assert not (tmp_path / "job" / "mossnet").exists()


def test_the_cpu_recipe_trains_no_ladder_it_cannot_judge(tmp_path):
    """The cpu recipe's training ladders are the scaling ladder (with its seed rungs) and the comparison: MossNet's
    3-size ladder could decide nothing at this scale."""
    cpu = Job(load_recipe("cpu"), tmp_path)
    assert [name for name, _ in cpu.training_ladders()] == ["scaling", "compare"]
    seeded = [r for r in cpu.scaling_ladder().rungs if r.archs is not None]
    assert [(r.name, r.archs, r.train["seed"]) for r in seeded] == [
        (f"{n}-s1", ["llama", "hgrn2"], 1) for n in ("0.033m", "0.056m", "0.16m")]
    assert [name for name, _ in Job(load_recipe("smoke"), tmp_path).training_ladders()] == ["scaling", "compare"]


def test_a_recipe_without_mqar_trains_none_of_it_and_its_claims_say_why(tmp_path):
    """The cpu recipe gives MQAR no widths: the section and the two studies on its task skip, train nothing, and
    every claim that reads them says "cannot tell" with the reason (its report shows the skip)."""
    from linlm.reproduce.claims import judge
    from linlm.reproduce.sections import mqar, retrieval_studies

    job = Job(load_recipe("cpu"), tmp_path / "job")
    for section in (mqar.SECTION, retrieval_studies.ASPECT, retrieval_studies.CONTEXT):
        job.results[section.name] = section.run(job, lambda f: None)
        assert "gives no" in job.results[section.name]["not_run"], section.name
    assert job.results["mqar"]["not_run"].startswith("recipe cpu gives no MQAR widths")
    assert ("p", f"Skipped: {job.results['mqar']['not_run']}.") in mqar.SECTION.render(job, [])
    verdicts = {v.key: v for v in judge(job.results)}
    for key in ("weaker-retrieval", "decay", "heads", "delta-recall", "aspect", "context"):
        assert verdicts[key].verdict == "cannot tell" and "gives no" in verdicts[key].why, (key, verdicts[key].why)
    assert not (tmp_path / "job").exists() or not any((tmp_path / "job").rglob("mqar.json"))


def test_the_hybrid_study_trains_each_linear_model_alone_with_attention_and_llama(tmp_path):
    from linlm.reproduce.claims import judge
    from linlm.reproduce.sections import hybrid
    from linlm.train.model_dirs import load

    job = Job(load_recipe("smoke"), tmp_path / "job", say=lambda s: None)
    job.recipe.hybrid.validate()
    res = job.results["hybrid"] = hybrid.SECTION.run(job, lambda f: None)
    runs = {r["name"]: r for r in res["runs"]}
    assert set(runs) == {"llama-d16", "hgrn2-d16", "hgrn2-attn2-d16"}
    assert {n: r["study"]["hybrid"] for n, r in runs.items()} == {
        "llama-d16": "attention", "hgrn2-d16": "linear", "hgrn2-attn2-d16": "hybrid"}
    # The hybrid is the linear stack with its second layer attention: more FLOPs than the linear model, fewer than
    # LLaMA's, all counted.
    flops = {n: r["flops_per_token"] for n, r in runs.items()}
    assert flops["hgrn2-d16"] != flops["hgrn2-attn2-d16"] and all(f > 0 for f in flops.values())
    model = load(tmp_path / "job" / "hybrid" / "hgrn2-attn2-d16-s0")
    assert model.config.attention_layers == (1,) and model.config.arch == "hgrn2"
    blocks = hybrid.SECTION.render(job, [])
    table = next(b for b in blocks if b[0] == "table")
    assert table[1][:2] == ["configuration", "layers"] and len(table[2]) == 3
    v = next(v for v in judge(job.results) if v.key == "hybrid")
    assert v.verdict == "cannot tell"  # one seed: the smoke recipe decides nothing


@pytest.mark.parametrize("key, bad, named", [
    ("aspect", {"shapes": [[48, 3], [64, 2]]}, "each of at least 3 layers"),
    ("aspect", {"shapes": [[48, 3]]}, "give 2 or more"),
    ("aspect", {"shapes": [[40, 3], [48, 4]]}, "multiple of head_dim 16"),
    ("context", {"gaps": [64]}, "give 2 or more different gaps"),
    ("hybrid", {"archs": ["llama"]}, "cannot take attention layers"),
    ("hybrid", {"archs": ["hgrn2"], "n_layers": 2, "every": 3}, "give 2 to n_layers (2)"),
    ("hybrid", {"archs": ["hgrn2"], "n_layers": 4, "window": -1}, "give 0 (full attention)"),
    ("scaling", {"ladder": "smoke", "seeds": {"rungs": ["nosuch"], "archs": ["llama"]}}, "seeds: ['nosuch']"),
])
def test_a_study_that_cannot_be_run_is_refused_in_one_line_before_any_work(tmp_path, capsys, monkeypatch, key, bad,
                                                                           named):
    import linlm.reproduce.job
    from linlm.cli import main

    monkeypatch.setattr(linlm.reproduce.job, "load_recipe",
                        lambda name: load_recipe("smoke").with_settings(**{key: bad}))
    out = tmp_path / "job"
    assert main(["reproduce", "--recipe", "smoke", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and f"recipe smoke: {key}" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_the_cpu_long_recipe_trains_the_delta_rule_and_its_peers_at_equal_state():
    """The delta-rule claim compares only runs whose state per layer agrees within its tolerance: the cpu-long
    recipe's per_arch options give DeltaNet, Gated DeltaNet, HGRN2 and Mamba-2 the same state (measured from their decoding
    states, as the experiment records it), so no pair of the claim is left out for unequal states."""
    from linlm import create_model
    from linlm.eval.mqar import state_floats
    from linlm.experiments.mqar_grid import model_overrides
    from linlm.reproduce.claims.delta_rule import DELTA, PEERS, STATE_TOL

    m = load_recipe("cpu-long").mqar
    task = m.task
    states = {}
    for c in m.configs():
        name = c.name().rsplit("-d", 1)[0]
        if name in (*DELTA, *PEERS):
            over = model_overrides(c, m.n_layers, m.head_dim, task.vocab_size, task.seq_len)
            states[name] = state_floats(create_model(c.arch, preset=None, **over), task.seq_len) / over["n_layers"]
    assert sorted(states) == sorted((*DELTA, *PEERS))
    assert max(states.values()) / min(states.values()) - 1 <= STATE_TOL, states
