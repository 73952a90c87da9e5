"""Shape studies: aspect-ratio and context-length ladders as data, run through the one runner, scored per shape;
their mistakes refused before any training; MossNet's ladder counted from active parameters."""

from __future__ import annotations

import json

import pytest
import yaml

from linlm.cli import main
from linlm.errors import ConfigError
from linlm.scaling.ladder import ladder_from_dict, load_ladder, plan_runs
from linlm.scaling.shapes import summarize

TRAIN = {"data": {"source": "shakespeare", "tokenizer": "bpe:300", "seq_len": 32, "val_fraction": 0.1},
         "batch_size": 8, "eval": {"every": 0}, "samples": {"prompts": [], "max_new_tokens": 0}}


def aspect(**study) -> dict:
    base = {"kind": "aspect", "model": {"max_seq_len": 64}, "head_dim": 16, "tokens": 2048,
            "shapes": [{"d_model": 16, "n_layers": 4}, {"d_model": 32, "n_layers": 1}]}
    return {"name": "a", "archs": ["llama"], "train": TRAIN, "study": {**base, **study}}


def context(**study) -> dict:
    base = {"kind": "context", "model": {"n_layers": 1, "d_model": 16, "n_heads": 1}, "contexts": [16, 32],
            "tokens_per_step": 128, "tokens": 2048}
    return {"name": "c", "archs": ["llama"], "train": TRAIN, "study": {**base, **study}}


def test_an_aspect_study_is_one_rung_per_shape_and_seed_with_its_tags(tmp_path):
    lad = ladder_from_dict(aspect(seeds=[0, 1]), "a", "a.yaml")
    assert [r.name for r in lad.rungs] == ["d16-l4-s0", "d16-l4-s1", "d32-l1-s0", "d32-l1-s1"]
    assert lad.study == {"kind": "aspect"}
    assert lad.rungs[3].tags == {"shape": "d32-l1", "d_model": 32, "n_layers": 1, "n_heads": 2, "seed": 1}
    runs = plan_runs(lad, None, tmp_path, None)
    assert [(r.config.model.overrides["n_heads"], r.config.seed) for r in runs] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert {r.tokens for r in runs} == {2048}


def test_a_context_study_keeps_the_tokens_per_step_and_the_model(tmp_path):
    runs = plan_runs(ladder_from_dict(context(), "c", "c.yaml"), None, tmp_path, None)
    assert [(r.name, r.config.data.seq_len, r.config.batch_size, r.config.steps) for r in runs] == [
        ("llama-ctx16", 16, 8, 16), ("llama-ctx32", 32, 4, 16)]
    # The model is the same at every context: max_seq_len is the longest context, so the count is one.
    assert {r.config.model.overrides["max_seq_len"] for r in runs} == {32}
    assert len({r.params for r in runs}) == 1


@pytest.mark.parametrize("data, words", [
    (aspect(shapes=[{"d_model": 24, "n_layers": 2}, {"d_model": 32, "n_layers": 1}]),
     "d_model 24 does not divide into heads of head_dim 16"),
    (aspect(head_dim=0, shapes=[{"d_model": 24, "n_layers": 2, "n_heads": 5}, {"d_model": 32, "n_layers": 1}]),
     "d_model 24 does not divide into n_heads=5 heads"),
    (aspect(shapes=[{"d_model": 32, "n_layers": 1}]), "needs at least 2 shapes"),
    (context(model={"n_layers": 1, "d_model": 16, "n_heads": 1, "max_seq_len": 16}),
     "32 is longer than the model's max_seq_len=16"),
    (context(tokens_per_step=100), "100 is not a whole number of sequences of context 16"),
    (context(contexts=[16, 16]), "each must be given once"),
    (context(kind="depth"), "'depth' is not one of"),
])
def test_a_bad_study_is_one_line_exit_2_before_any_work(tmp_path, capsys, data, words):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "sweep"
    for extra in ([], ["--dry-run"]):
        assert main(["scaling", "run", "--ladder", str(path), "--out", str(out), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_a_context_longer_than_the_data_is_refused_before_any_training(tmp_path, capsys, cache_env):
    text = tmp_path / "short.txt"
    text.write_text("A few words of text, far too few for the context.\n" * 12)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(context(contexts=[16, 256], tokens_per_step=512)))
    out = tmp_path / "sweep"
    assert main(["scaling", "run", "--ladder", str(path), "--out", str(out), "--set",
                 f"data.source={text}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "run llama-ctx256 has context 256, longer than the" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_aspect_and_context_studies_end_to_end_through_the_cli(tmp_path, capsys, text_file):
    for ladder, arch, labels in (("aspect-smoke", "llama", ["d16-l4", "d32-l1"]),
                                 ("context-smoke", "hgrn2", ["ctx16", "ctx32"])):
        out = tmp_path / ladder
        assert main(["scaling", "run", "--ladder", ladder, "--archs", arch, "--out", str(out), "--set",
                     f"data.source={text_file}"]) == 0
        meta = json.loads((out / "runs" / f"{arch}-{labels[1]}" / "scaling.json").read_text())
        assert meta["study"]["kind"] == ladder.split("-")[0]
        capsys.readouterr()
        assert main(["scaling", "study", str(out), "--json", "--max-tokens", "2000"]) == 0
        res = json.loads(capsys.readouterr().out)
        a = res["archs"][arch]
        assert list(a["shapes"]) == labels and a["seed_range"] is None
        losses = [a["shapes"][s]["loss"] for s in labels]
        assert a["spread"] == pytest.approx(max(losses) - min(losses))
        runs = {r["run"]: r for r in res["runs"]}
        if ladder.startswith("context"):
            # Scored at the shortest context (the spread) and at its own; the shortest run's two are one number.
            assert res["common_context"] == 16 and res["loss"] == "val_loss_common"
            short, long = runs[f"{arch}-ctx16"], runs[f"{arch}-ctx32"]
            assert short["val_loss"] == short["val_loss_common"] and long["val_loss"] != long["val_loss_common"]
        assert main(["scaling", "study", str(out)]) == 0
        assert labels[0] in capsys.readouterr().out
        if ladder.startswith("aspect"):
            shape_study_downstream(out, arch, labels, res, text_file, capsys)


def shape_study_downstream(out, arch, labels, res, text_file, capsys):
    """The paper's tables of a shape study: each run's final checkpoint scored on LAMBADA and WikiText-2 (the task
    files given) and NIAH, each shape's cell holding its seeds' mean, kept so that a second call scores nothing
    and a call with other settings scores again."""
    from pathlib import Path

    from linlm.scaling import downstream
    from linlm.scaling.shapes import study_downstream

    data = Path(__file__).parents[1] / "eval" / "data"
    tasks = out.parent / "tasks"  # no commonsense files: no average
    tasks.mkdir()
    for name in ("lambada_openai.jsonl", "wikitext2.jsonl"):
        (tasks / name).write_bytes((data / name).read_bytes())
    assert main(["scaling", "study", str(out), "--json", "--data-dir", str(tasks), "--limit", "2", "--trials", "1",
                 "--haystack", str(text_file)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["downstream"]["measures"] == ["lambada_acc", "lambada_ppl", "wikitext2_word_ppl"]
    assert got["downstream"]["settings"]["tasks"] == ["lambada", "wikitext2"]
    for label in labels:
        run = next(r for r in got["runs"] if r["run"] == f"{arch}-{label}")
        cell = got["archs"][arch]["shapes"][label]["downstream"]
        assert cell == {m: run["downstream"][m] for m in got["downstream"]["measures"]}  # one seed: its scores
        assert cell["wikitext2_word_ppl"] > 1 and 0 <= cell["lambada_acc"] <= 1
        # A context of 32 tokens cannot hold a needle and its question: NIAH says why instead of a number.
        assert "too short for the needle" in run["downstream"]["niah_skipped"]
    # Two different shapes, two different models: their perplexities differ.
    ppl = [got["archs"][arch]["shapes"][s]["downstream"]["wikitext2_word_ppl"] for s in labels]
    assert ppl[0] != ppl[1]
    # Kept: the same settings again score nothing; another limit scores every run again.
    calls = []
    real = downstream.score_checkpoint

    def counted(*a, **k):
        calls.append(k["limit"])
        return real(*a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(downstream, "score_checkpoint", counted)
        again = study_downstream(out, json.loads(json.dumps(res)), data_dir=tasks, haystack=str(text_file), limit=2,
                                 trials=1)
        assert calls == [] and all(again["archs"][arch]["shapes"][s]["downstream"]
                                   == got["archs"][arch]["shapes"][s]["downstream"] for s in labels)
        study_downstream(out, json.loads(json.dumps(res)), data_dir=tasks, haystack=str(text_file), limit=3,
                         trials=1)
        assert calls == [3, 3]
    assert main(["scaling", "study", str(out), "--downstream", "--haystack", str(text_file), "--trials", "1"]) == 0
    table = capsys.readouterr().out
    assert "val loss" in table and "WikiText-2" not in table  # no task files: NIAH only, and it was skipped


def test_study_of_a_directory_without_study_runs_is_one_line(tmp_path, capsys):
    assert main(["scaling", "study", str(tmp_path)]) == 2
    assert "holds no finished run of a study" in capsys.readouterr().err


def test_the_summary_takes_means_over_seeds_and_the_spread_across_shapes():
    rows = [{"arch": "llama", "params": 10, "study": {"kind": "aspect", "shape": s, "d_model": d, "seed": seed},
             "val_loss": loss}
            for s, d, seed, loss in (("d8-l2", 8, 0, 3.0), ("d8-l2", 8, 1, 3.2), ("d16-l1", 16, 0, 2.5),
                                     ("d16-l1", 16, 1, 2.55))]
    a = summarize("aspect", rows, "val_loss")["archs"]["llama"]
    assert a["shapes"]["d8-l2"]["loss"] == pytest.approx(3.1) and a["shapes"]["d16-l1"]["loss"] == pytest.approx(2.525)
    assert a["spread"] == pytest.approx(0.575) and a["seed_range"] == pytest.approx(0.2) and a["best"] == "d16-l1"


def test_the_mossnet_ladder_counts_active_parameters(tmp_path):
    from linlm.models.counting import count

    runs = plan_runs(load_ladder("mossnet-cpu"), None, tmp_path, None)
    assert {r.arch for r in runs} == {"llama", "mamba", "mossnet"}
    for r in (r for r in runs if r.arch == "mossnet"):
        c = count(r.config.model_config(vocab_size=256), batch=r.config.batch_size, seq_len=r.config.data.seq_len)
        assert r.params == c["active_non_embedding_params"] < c["non_embedding_params"]


def test_every_builtin_study_ladder_loads():
    for name in ("aspect-cpu", "context-cpu", "aspect-smoke", "context-smoke", "aspect-paper", "context-paper"):
        lad = load_ladder(name)
        assert lad.study["kind"] in ("aspect", "context") and all(r.tags for r in lad.rungs)
    with pytest.raises(ConfigError, match="either rungs or a study"):
        ladder_from_dict({**aspect(), "rungs": [{"name": "x", "model": {}, "tokens": 1}]}, "a", "a.yaml")


@pytest.mark.parametrize("ladder, key, words", [("context-smoke", "data.seq_len=16",
                                                 "ladder context-smoke sets data.seq_len run by run"),
                                                ("aspect-smoke", "model.overrides.d_model=64",
                                                 "ladder aspect-smoke sets model.overrides.d_model run by run")])
def test_a_set_that_undoes_the_study_is_refused(tmp_path, capsys, ladder, key, words):
    out = tmp_path / "sweep"
    assert main(["scaling", "run", "--ladder", ladder, "--out", str(out), "--set", key, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and not out.exists()


def test_the_paper_aspect_study_holds_its_1b_size_at_every_shape(tmp_path):
    runs = plan_runs(load_ladder("aspect-paper"), ["llama"], tmp_path, None)
    assert [r.rung for r in runs] == ["d1536-l32", "d1792-l24", "d2048-l18", "d3072-l8"]
    # The paper's 1B LLaMA: 906.2M non-embedding parameters; every shape within 3 % of it.
    assert all(abs(r.params / 906.2e6 - 1) < 0.03 for r in runs)
    assert [r.config.model.overrides["n_heads"] for r in runs] == [12, 14, 16, 24]
