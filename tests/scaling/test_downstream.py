"""`linlm scaling evaluate`: every kept checkpoint of every run scored and placed at its training compute, resumably,
with a power law fitted to the perplexities; a sweep without kept checkpoints refused in one line."""

import json
from pathlib import Path

import pytest
from scaling_helpers import write_run

from linlm.errors import ConfigError

EVAL_DATA = Path(__file__).parents[1] / "eval" / "data"
HAY = ("The rain had stopped and the grass was wet. She walked out into the garden and looked at the trees. "
       "He counted the coins twice. There were ten of them, all silver, and he put them back in the box. ") * 20


@pytest.fixture(scope="module")
def tokenizer():
    from linlm.data.tokenizer import Tokenizer

    texts = [line for f in sorted(EVAL_DATA.glob("*.jsonl")) for line in f.read_text().splitlines()]
    return Tokenizer.train(texts + [HAY], 300)


def kept_sweep(root: Path, tokenizer, steps=(1, 3, 8)) -> Path:
    """Two runs (llama, tnl) of a synthetic sweep, each with checkpoints at ``steps``: tiny saved models."""
    import torch

    from linlm import create_model

    for arch in ("llama", "tnl"):
        run = write_run(root, f"{arch}-r", arch, 1e4, [256 * s for s in range(1, 9)], [3.0] * 8)
        (run / "config.yaml").write_text("data:\n  seq_len: 160\n")
        for s in steps:
            torch.manual_seed(s)
            model = create_model(arch, preset="tiny", vocab_size=320, **({"max_seq_len": 256} if arch == "llama"
                                                                        else {}))
            path = run / "checkpoints" / f"step_{s:08d}"
            model.save(path)
            tokenizer.save(path)
    return root


def test_every_kept_checkpoint_is_scored_against_compute_and_resumes(tmp_path, tokenizer, monkeypatch):
    from linlm.scaling import downstream

    import shutil

    sweep = kept_sweep(tmp_path / "sweep", tokenizer)
    data = tmp_path / "tasks"  # LAMBADA and WikiText-2 only: the commonsense files are absent, so no average
    data.mkdir()
    for name in ("lambada_openai.jsonl", "wikitext2.jsonl"):
        shutil.copyfile(EVAL_DATA / name, data / name)
    hay = tmp_path / "hay.txt"
    hay.write_text(HAY)
    seen = []
    summary = downstream.evaluate_sweep(sweep, data_dir=data, haystack=str(hay), limit=2, trials=1,
                                        progress=lambda run, step, done: seen.append((run, step, done)))
    assert seen == [(r, s, False) for r in ("llama-r", "tnl-r") for s in (1, 3, 8)]
    pts = summary["points"]
    # C = 6 N x tokens per step x step, in PFLOP/s-days.
    from linlm.scaling.fits import PFLOPS_DAY

    assert [p["compute_pflops_days"] for p in pts[:3]] == pytest.approx([6e4 * 256 * s / PFLOPS_DAY
                                                                         for s in (1, 3, 8)])
    for p in pts:
        assert set(downstream.MEASURES) - set(p) == {"commonsense_avg"}
        assert 0 <= p["niah_mean"] <= 1 and p["wikitext2_word_ppl"] > 1 and p["niah_chance"] == 0.25
    # Each run's 3 checkpoints: a power law per architecture for each perplexity, matching a log-space line.
    import numpy as np

    for m in downstream.FITTED:
        assert set(summary["fits"][m]) == {"llama", "tnl"}
        xs = [p["compute_pflops_days"] for p in pts if p["arch"] == "tnl"]
        ys = [p[m] for p in pts if p["arch"] == "tnl"]
        alpha, _ = np.polyfit(np.log(xs), np.log(ys), 1)
        assert summary["fits"][m]["tnl"]["alpha"] == pytest.approx(alpha)
    out = sweep / "downstream"
    assert sorted(summary["plots"]) == sorted(f"{m}.png" for m in downstream.MEASURES if m != "commonsense_avg")
    assert all((out / name).is_file() for name in summary["plots"])
    # Resumable: a second call scores nothing and gives the same points.
    monkeypatch.setattr(downstream, "score_checkpoint", lambda *a, **k: pytest.fail("scored again"))
    seen.clear()
    again = downstream.evaluate_sweep(sweep, data_dir=data, haystack=str(hay), limit=2, trials=1,
                                      progress=lambda run, step, done: seen.append(done))
    assert seen == [True] * 6 and again["points"] == pts


def test_a_sweep_without_kept_checkpoints_is_refused_in_one_line(tmp_path, tokenizer, capsys):
    from output_asserts import one_line_error

    from linlm.cli import main
    from linlm.scaling.downstream import kept_checkpoints

    sweep = kept_sweep(tmp_path / "sweep", tokenizer, steps=(8,))
    with pytest.raises(ConfigError, match="checkpoint.keep_log"):
        kept_checkpoints(sweep)
    assert main(["scaling", "evaluate", str(sweep)]) == 2
    one_line_error(capsys.readouterr().err, "no run kept checkpoints along training", "checkpoint.keep_every_tokens")


def test_a_context_too_short_for_a_needle_leaves_niah_out_with_why(tmp_path, tokenizer):
    """A run trained at 16 tokens: NIAH cannot place a needle and its question, so the checkpoint's scores say why
    instead of failing the sweep; the zero-shot scores are unaffected."""
    from linlm.scaling.downstream import score_checkpoint

    sweep = kept_sweep(tmp_path / "sweep", tokenizer, steps=(1, 2))
    path = sweep / "runs" / "tnl-r" / "checkpoints" / "step_00000002"
    short = score_checkpoint(path, data_dir=EVAL_DATA, seq_len=16, haystack=[HAY], limit=2, trials=1)
    assert "too short for the needle" in short["niah_skipped"] and "niah_mean" not in short
    full = score_checkpoint(path, data_dir=EVAL_DATA, seq_len=160, haystack=[HAY], limit=2, trials=1)
    assert "niah_skipped" not in short.keys() & full.keys() and "niah_mean" in full
    assert {k: v for k, v in short.items() if k != "niah_skipped"} == {k: v for k, v in full.items()
                                                                      if not k.startswith("niah")}
