"""Reading sweep directories, `linlm scaling fit` and `linlm scaling report`, and the bad inputs they refuse."""

from __future__ import annotations

import json
import math

import pytest
from output_asserts import assert_png, forbid, one_line_error, snapshot
from scaling_helpers import ALPHA, arch_beta, synthetic_sweep, write_run

from linlm.cli import main
from linlm.errors import DataError
from linlm.scaling.analysis import FitOptions, analyze
from linlm.scaling.runs import load_runs

FAST = FitOptions(bootstrap=50, parametric_bootstrap=2)


def test_fit_json_recovers_the_law(sweep, capsys):
    assert main(["scaling", "fit", str(sweep), "--json", "--bootstrap", "50", "--parametric-bootstrap", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    # 10 sizes each, four of LLaMA's trained with a second seed.
    assert sorted(out["archs"]) == ["llama", "tnl"] and len(out["runs"]) == 24 and not out["skipped"]
    for k, arch in enumerate(("llama", "tnl")):
        fits = out["archs"][arch]
        b = arch_beta(k)
        law = fits["envelope"]["L(C)"]
        assert law["alpha"] == pytest.approx(-ALPHA * b / (ALPHA + b), rel=0.02)
        assert law["alpha_ci"][0] < law["alpha"] < law["alpha_ci"][1] and law["r2"] > 0.99
        # Each fit says what it rests on: its points, runs and sizes, and its replicates (kept, with the failed).
        env = fits["envelope"]
        assert env["sizes"] == 10 and env["runs"] == (14 if arch == "llama" else 10) and env["points"] >= 3
        reps = env["replicates"]
        assert reps["drawn"] == 50 and reps["used"] + reps["failed"] == 50 and len(law["samples"]) == reps["used"]
        # LLaMA's spread is its own seeds'; TNL, with one seed per size, takes it pooled from LLaMA's.
        assert reps["spread"]["source"] == ("its own seeds" if arch == "llama" else "pooled from the seeds of llama")
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
    # Two architectures: two panels side by side (6.2 x 4.2 inches each) at 110 dpi; the allocation plot 12.4 x 4.4.
    for png, size in (("loss_vs_compute.png", (1364, 462)), ("optimal_allocation.png", (1364, 484)),
                      ("isoflop.png", (1364, 462))):
        assert_png(out / png, size)
        assert f"]({png})" in md
    assert html.count("src='data:image/png;base64,") == 3 and "src='http" not in html
    assert "3.7087" in md.replace("3.709", "3.7087")  # the paper's LLaMA beta sits beside the fit
    assert "| llama | L(C) |" in md and "paper alpha" in md
    assert json.loads((out / "fit.json").read_text())["archs"]["llama"]["envelope"]["L(C)"]["alpha"] < 0
    # A second report replaces linlm's own files, and keeps a file of the user's that it does not write.
    (out / "notes.txt").write_text("mine")
    assert main(["scaling", "report", str(sweep), "--out", str(out), "--bootstrap", "0", "--parametric-bootstrap",
                 "0"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and "95% CI" in (out / "report.md").read_text()


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
    assert math.isclose(r.curve.paper_flops_per_token, want["flops_per_step"] / 128)


@pytest.mark.parametrize("case, reason", [
    ("a user's report.md", "holds files linlm did not write (report.md)"),
    ("report.md in linlm's report directory", "report.md exists and linlm did not write it"),
    ("a user's directory", "holds files linlm did not write (notes.txt)"),
    ("a path under a file", "is a file and not a directory"),
])
def test_report_out_is_checked_before_the_fits(case, reason, sweep, tmp_path, capsys, monkeypatch):
    """A user's DIR/report.md used to be replaced, and --out FILE/r ended in a traceback after the fits. Now: one
    line, exit 2, nothing written, and no fit made."""
    from linlm import outputs

    forbid(monkeypatch, "linlm.scaling.analysis.analyze", why="the fits ran before --out was checked")
    (tmp_path / "afile").write_text("a file")
    (tmp_path / "users").mkdir()
    (tmp_path / "users" / "notes.txt").write_text("mine")
    (tmp_path / "report").mkdir()
    if case == "report.md in linlm's report directory":
        outputs.write_json(tmp_path / "report" / "fit.json", {})  # the directory is linlm's; report.md is not
    (tmp_path / "report" / "report.md").write_text("# my own report")
    target = {"a user's directory": tmp_path / "users", "a path under a file": tmp_path / "afile" / "r"}.get(
        case, tmp_path / "report")
    before = snapshot(tmp_path)
    assert main(["scaling", "report", str(sweep), "--out", str(target)]) == 2
    one_line_error(capsys.readouterr().err, "--out", reason)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("key, value, where", [("params", 0, "scaling.json: params is 0"),
                                               ("params", -3e6, "scaling.json: params is -3e+06"),
                                               ("loss", 0.0, "metrics.jsonl: loss 0 at"),
                                               ("loss", -1.5, "metrics.jsonl: loss -1.5 at")])
def test_fit_refuses_impossible_params_and_losses_naming_the_file(key, value, where, sweep, capsys):
    """N <= 0 used to end in numpy's LinAlgError; a loss <= 0 was silently left out of the fits."""
    run = sweep / "runs" / "llama-3"
    if key == "params":
        meta = json.loads((run / "scaling.json").read_text())
        (run / "scaling.json").write_text(json.dumps({**meta, "params": value}))
    else:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        lines[5] = json.dumps({**json.loads(lines[5]), "loss": value})
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["scaling", "fit", str(sweep), "--bootstrap", "0", "--parametric-bootstrap", "0"]) == 2
    one_line_error(capsys.readouterr().err, str(run / where.split(":")[0]), where, "llama-3")


def test_a_run_description_without_params_is_named_and_skipped(sweep, capsys):
    run = sweep / "runs" / "tnl-2"
    meta = json.loads((run / "scaling.json").read_text())
    del meta["params"]
    (run / "scaling.json").write_text(json.dumps(meta))
    assert "unreadable run description" in dict(load_runs(sweep).skipped)["tnl-2"]
    assert main(["scaling", "fit", str(sweep), "--strict"]) == 2
    one_line_error(capsys.readouterr().err, "run tnl-2: unreadable run description", "params")


def test_flops_per_s_zero_is_refused_not_read_as_unset(tmp_path, capsys):
    assert main(["scaling", "run", "--ladder", "smoke", "--out", str(tmp_path / "s"), "--dry-run", "--no-measure",
                 "--flops-per-s", "0"]) == 2
    one_line_error(capsys.readouterr().err, "--flops-per-s: must be > 0")
    assert not (tmp_path / "s").exists()


def test_plots_leave_pyplot_and_the_backend_alone(tmp_path):
    """Every plot of linlm (the scaling report's, the NIAH heatmap, the profile) is a Figure of its own: pyplot is
    never imported, so no figure registry or backend of the calling program is touched."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    sweep = synthetic_sweep(tmp_path / "sweep", archs=("tnl",), sizes=4)  # small: the plots, not the fits, matter
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]), MPLBACKEND="")
    code = f"""
import sys, matplotlib
matplotlib.use("svg")  # the calling program's choice, which linlm must leave as it is
from linlm.scaling.analysis import FitOptions, analyze
from linlm.scaling.report import write_report
from linlm.eval.niah import plot_heatmap
from linlm.infer.profile import ProfileRow, plot
fits = analyze({str(sweep)!r}, options=FitOptions(bootstrap=0, parametric_bootstrap=0))
write_report(fits, {str(tmp_path / "r")!r})
plot_heatmap(dict(mode="easy", lengths=[100, 200], depths=[0.0, 100.0], accuracy=[[1, 0], [0, 1]], mean=0.5,
                  weighted=0.5), {str(tmp_path / "h.png")!r})
plot([ProfileRow("tnl", n, "cpu", "float32", decode_ms_per_token=1.0) for n in (8, 16)], {str(tmp_path / "p.png")!r})
print("matplotlib.pyplot" in sys.modules, matplotlib.get_backend())
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["False", "svg"]
