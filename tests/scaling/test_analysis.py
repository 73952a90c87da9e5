"""Reading sweep directories, `linlm scaling fit` and `linlm scaling report`, and the bad inputs they refuse."""

from __future__ import annotations

import json
import math

import pytest
from scaling_helpers import ALPHA, arch_beta, write_run

from linlm.cli import main
from linlm.errors import DataError
from linlm.scaling.analysis import FitOptions, analyze
from linlm.scaling.runs import load_runs

FAST = FitOptions(bootstrap=50, parametric_bootstrap=2)


def test_fit_json_recovers_the_law(sweep, capsys):
    assert main(["scaling", "fit", str(sweep), "--json", "--bootstrap", "50", "--parametric-bootstrap", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(out["archs"]) == ["llama", "tnl"] and len(out["runs"]) == 20 and not out["skipped"]
    for k, arch in enumerate(("llama", "tnl")):
        fits = out["archs"][arch]
        b = arch_beta(k)
        law = fits["envelope"]["L(C)"]
        assert law["alpha"] == pytest.approx(-ALPHA * b / (ALPHA + b), rel=0.02)
        assert law["alpha_ci"][0] < law["alpha"] < law["alpha_ci"][1] and law["r2"] > 0.99
        assert fits["parametric"]["a"] == pytest.approx(ALPHA, rel=0.05)
        assert fits["paper"]["L(C)"]["alpha"] < 0
    (cross,) = out["crossovers"]
    # tnl's steeper law (b = 0.308 vs 0.28) wins beyond the crossing.
    assert {cross["a"], cross["b"]} == {"llama", "tnl"} and cross["lower_after"] == "tnl"
    assert cross["ci"][0] < cross["compute_pflops_days"] < cross["ci"][1]


def test_report_writes_markdown_and_self_contained_html(sweep, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["scaling", "report", str(sweep), "--out", str(out), "--bootstrap", "30", "--parametric-bootstrap", "2"]) == 0
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for png in ("loss_vs_compute.png", "optimal_allocation.png", "isoflop.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in md
    assert html.count("src='data:image/png;base64,") == 3 and "src='http" not in html
    assert "3.7087" in md.replace("3.709", "3.7087")  # the paper's LLaMA beta sits beside the fit
    assert "| llama | L(C) |" in md and "paper alpha" in md
    assert json.loads((out / "fit.json").read_text())["archs"]["llama"]["envelope"]["L(C)"]["alpha"] < 0


def test_nan_and_empty_runs_are_named_and_skipped_or_fail_on_request(sweep, capsys):
    write_run(sweep, "llama-bad", "llama", 5e6, [1e6, 2e6, 3e6], [5.0, float("nan"), 4.0])
    (sweep / "runs" / "llama-bad" / "metrics.jsonl").write_text(
        '{"step": 1, "tokens": 1, "loss": 5.0}\n{"step": 2, "tokens": 2, "loss": null}\n')
    write_run(sweep, "tnl-empty", "tnl", 5e6, [], [])
    loaded = load_runs(sweep)
    reasons = dict(loaded.skipped)
    assert "NaN or missing loss at step 2" in reasons["llama-bad"]
    assert "no losses logged" in reasons["tnl-empty"]
    assert main(["scaling", "fit", str(sweep), "--bootstrap", "0", "--parametric-bootstrap", "0"]) == 0
    assert "skipped llama-bad: NaN or missing loss at step 2" in capsys.readouterr().err
    assert main(["scaling", "fit", str(sweep), "--strict"]) == 2
    assert "run llama-bad: NaN or missing loss" in capsys.readouterr().err


def test_unfinished_runs_are_skipped_unless_asked(sweep):
    write_run(sweep, "llama-half", "llama", 5e6, [1e6, 2e6, 3e6, 4e6], [5, 4.5, 4.2, 4.0], finished=False)
    assert "unfinished" in dict(load_runs(sweep).skipped)["llama-half"]
    assert "llama-half" in [r.name for r in load_runs(sweep, include_unfinished=True).runs]


def test_mixed_tokenizers_are_refused(sweep, capsys):
    write_run(sweep, "llama-other", "llama", 5e6, [1e6, 2e6], [5.0, 4.0], tokenizer="bpe:4096")
    with pytest.raises(DataError, match="different data or tokenizers"):
        load_runs(sweep)
    assert main(["scaling", "fit", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert "bpe:4096" in err and "Traceback" not in err


def test_too_few_runs_say_how_many_are_needed(tmp_path, capsys):
    root = tmp_path / "few"
    write_run(root, "llama-a", "llama", 1e6, [1e6, 2e6, 4e6], [5.0, 4.5, 4.2])
    write_run(root, "llama-b", "llama", 2e6, [1e6, 2e6, 4e6], [5.1, 4.4, 4.0])
    a = analyze(root, options=FAST)
    assert "at least 3 are needed" in a.archs["llama"].errors["envelope"]
    assert "at least 3 are needed" in a.archs["llama"].errors["isoflop"]
    assert "at least 8 are needed" in a.archs["llama"].errors["parametric"]
    assert main(["scaling", "fit", str(root), "--strict", "--bootstrap", "0", "--parametric-bootstrap", "0"]) == 2
    assert "needed" in capsys.readouterr().err


def test_missing_or_empty_directory(tmp_path, capsys):
    assert main(["scaling", "fit", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["scaling", "fit", str(tmp_path / "empty")]) == 2
    assert "holds no training runs" in capsys.readouterr().err


def test_plain_training_run_directories_are_read(tmp_path):
    """A run without scaling.json: N and FLOPs per token come from its config.yaml."""
    import yaml

    from linlm.models.counting import count
    from linlm.models.presets import preset_config

    run = tmp_path / "plain" / "r1"
    run.mkdir(parents=True)
    cfg = {"model": {"arch": "tnl", "overrides": {"n_layers": 2, "d_model": 64, "n_heads": 2}},
           "data": {"source": "x.txt", "seq_len": 32}, "batch_size": 4, "steps": 2}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run / "metrics.jsonl").write_text('{"step": 1, "tokens": 128, "loss": 5.0}\n{"step": 2, "tokens": 256, '
                                       '"loss": 4.0}\n')
    (run / "summary.json").write_text('{"step": 2, "interrupted": null}')
    (r,) = load_runs(tmp_path / "plain").runs
    want = count(preset_config("tnl", None, n_layers=2, d_model=64, n_heads=2), batch=4, seq_len=32)
    assert r.curve.params == want["active_non_embedding_params"]
    assert math.isclose(r.curve.flops_per_token, want["flops_per_step"] / 128)
