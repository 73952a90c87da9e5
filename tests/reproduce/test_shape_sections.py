"""The optional studies of a recipe (aspect ratio, context length, MossNet's ladder): their sections run tiny
ladders for real, skip when the recipe names none, and their claims follow the numbers."""

from __future__ import annotations

import dataclasses

import pytest

from linlm.reproduce.job import Job
from linlm.reproduce.recipes import load_recipe
from linlm.reproduce.sections import shape
from linlm.schema import load_yaml
from linlm.scaling.ladder import LADDER_DIR


def inline(name: str, archs: list[str]) -> dict:
    """A built-in ladder as a recipe's inline mapping, with other architectures."""
    return {"ladder": {**load_yaml(LADDER_DIR / f"{name}.yaml"), "archs": archs}}


def test_aspect_and_mossnet_sections_train_score_and_render(tmp_path, text_file):
    recipe = load_recipe("smoke").with_settings(aspect={**inline("aspect-smoke", ["llama", "hgrn2"]),
                                                        "max_tokens": 2000},
                                                mossnet=inline("mossnet-smoke", ["mossnet"]),
                                                fits={"bootstrap": 10, "parametric_bootstrap": 0})
    job = Job(recipe, tmp_path / "job", overrides={"data": {"source": str(text_file)}}, say=lambda s: None)
    job.plots.mkdir(parents=True)
    ticks = []
    for section in (shape.ASPECT, shape.ASPECT_LOSS, shape.MOSSNET, shape.MOSSNET_FITS):
        section.check(job, lambda key: "", False) if section.check else None
        job.results[section.name] = section.run(job, ticks.append)
    assert job.results["aspect"]["runs"] == ["llama-d16-l4", "hgrn2-d16-l4", "llama-d32-l1", "hgrn2-d32-l1"]
    res = job.results["aspect_loss"]
    assert set(res["archs"]) == {"llama", "hgrn2"} and all(len(a["shapes"]) == 2 for a in res["archs"].values())
    assert ticks[-1] == 1.0 and (job.plots / "aspect.png").is_file()
    blocks = shape.ASPECT_LOSS.render(job, [])
    table = next(b for b in blocks if b[0] == "table")
    assert [row[1] for row in table[2]] == ["d16-l4", "d32-l1", "d16-l4", "d32-l1"]
    # The MossNet ladder is fitted as the scaling sweep is; its report lands in DIR/mossnet_report.
    fits = job.results["mossnet_fits"]
    assert set(fits["archs"]) == {"mossnet"} and (tmp_path / "job" / "mossnet_report" / "report.md").is_file()
    assert any(b[0] == "table" for b in shape.MOSSNET_FITS.render(job, []))


def test_a_recipe_without_a_study_skips_it_and_says_so(tmp_path):
    job = Job(load_recipe("smoke"), tmp_path / "job")
    for section in (shape.ASPECT, shape.ASPECT_LOSS, shape.CONTEXT, shape.CONTEXT_LOSS, shape.MOSSNET,
                    shape.MOSSNET_FITS):
        section.check(job, lambda key: "", False) if section.check else None
        job.results[section.name] = section.run(job, lambda f: None)
        assert "gives no" in job.results[section.name]["not_run"]
    assert ("p", f"Skipped: {job.results['context_loss']['not_run']}.") in shape.CONTEXT_LOSS.render(job, [])
    from linlm.reproduce.claims import judge

    scales = next(v for v in judge(job.results) if v.key == "mossnet-scales")
    assert scales.verdict == "cannot tell" and "gives no mossnet ladder" in scales.why
    assert not (tmp_path / "job" / "aspect").exists()


def test_the_cpu_recipe_trains_the_three_studies_and_smoke_none(tmp_path):
    cpu = [name for name, _ in Job(load_recipe("cpu"), tmp_path).training_ladders()]
    assert cpu == ["scaling", "compare", "aspect", "context", "mossnet"]
    assert [name for name, _ in Job(load_recipe("smoke"), tmp_path).training_ladders()] == ["scaling", "compare"]


def test_a_recipe_whose_study_does_not_divide_into_heads_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import linlm.reproduce.job
    from linlm.cli import main

    bad = inline("aspect-smoke", ["llama"])
    bad["ladder"]["study"]["shapes"][0] = {"d_model": 24, "n_layers": 2}  # 24 is no multiple of head_dim 16
    monkeypatch.setattr(linlm.reproduce.job, "load_recipe",
                        lambda name: load_recipe("smoke").with_settings(aspect=bad))
    out = tmp_path / "job"
    assert main(["reproduce", "--recipe", "smoke", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "d_model 24 does not divide into heads of head_dim 16" in err and len(err.splitlines()) == 1
    assert not out.exists()
