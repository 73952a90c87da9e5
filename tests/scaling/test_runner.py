"""The sweep runner: the smoke ladder end to end, resume, the lock, --dry-run, --emit torchrun, bad ladders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from output_asserts import assert_png

from linlm import outputs
from linlm.cli import main
from linlm.errors import ConfigError, LockedError, OutputError, StorageError
from linlm.locking import DirLock
from linlm.models.registry import arch_names
from linlm.scaling.ladder import builtin_ladders, load_ladder, plan_runs
from linlm.scaling.runner import run_grid


def test_smoke_ladder_end_to_end_then_report(tmp_path, text_file, capsys):
    out = tmp_path / "sweep"
    args = ["scaling", "run", "--ladder", "smoke", "--out", str(out), "--set", f"data.source={text_file}"]
    assert main(args) == 0
    assert "12 run(s) trained, 0 already finished" in capsys.readouterr().out
    runs = sorted(p.name for p in (out / "runs").iterdir() if p.is_dir())
    assert len(runs) == 12 and "cosformer2-m" in runs and "hgrn2-xs" in runs
    # What the runner wrote is linlm's by the ledgers: the plan, each run's directory and scaling.json.
    assert outputs.owns_file(out / "plan.json") and outputs.owns_dir(out / "runs" / "tnl-s")
    assert outputs.owns_file(out / "runs" / "tnl-s" / "scaling.json")
    meta = json.loads((out / "runs" / "tnl-s" / "scaling.json").read_text())
    assert 0 < meta["data"]["epochs"] <= 4 and meta["compute_flops"] == pytest.approx(
        meta["paper_flops_per_token"] * meta["tokens"])
    recs = [json.loads(line) for line in (out / "runs" / "tnl-s" / "metrics.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in recs] == [meta["log_interval_tokens"] * (i + 1) for i in range(meta["steps"])]
    # A second invocation finds everything finished.
    assert main(args) == 0
    assert "0 run(s) trained, 12 already finished" in capsys.readouterr().out
    report = tmp_path / "report"
    assert main(["scaling", "report", str(out), "--out", str(report), "--bootstrap", "20",
                 "--parametric-bootstrap", "1"]) == 0
    md = (report / "report.md").read_text()
    assert md.count("| yes |") == 12
    # The page carries its three figures inline; the first has one panel per architecture, two to a row.
    assert (report / "report.html").read_text().count("src='data:image/png;base64,") == 3
    assert_png(report / "loss_vs_compute.png", (1364, 924))  # 4 architectures: 2 x 2 panels of 6.2 x 4.2 in


def test_interrupted_run_resumes_and_log_reads_as_one_run(tmp_path, text_file):
    from linlm.train import train

    ladder = load_ladder("smoke")
    over = {"data": {"source": str(text_file)}}
    out = tmp_path / "sweep"
    (first, *_) = plan_runs(ladder, ["llama"], out, over)
    partial = first.config
    partial.steps = first.config.steps // 2  # a run of this sweep stopped half way, with its checkpoint
    outputs.write_json(out / "plan.json", {"ladder": ladder.name, "archs": ["llama"], "runs": [first.name]})
    outputs.make_dir(partial.out_dir)
    train(partial, verbose=False, live=False)
    lines = []
    result = run_grid(ladder, ["llama"], out, overrides=over, say=lines.append)
    assert first.name in result["trained"] and any(f"resuming {first.name}" in s for s in lines)
    steps = [json.loads(x)["step"] for x in (out / "runs" / first.name / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, plan_runs(ladder, ["llama"], out, over)[0].config.steps + 1))


def test_directory_is_locked(tmp_path, text_file):
    out = tmp_path / "sweep"
    out.mkdir()
    with DirLock(out, "scaling directory"):
        with pytest.raises(LockedError, match=r"in use by PID \d+"):
            run_grid(load_ladder("smoke"), ["llama"], out, overrides={"data": {"source": str(text_file)}},
                     say=lambda s: None)


def test_dry_run_prints_runs_compute_epochs_and_time(tmp_path, text_file, capsys):
    args = ["scaling", "run", "--ladder", "smoke", "--archs", "llama,hgrn2", "--out", str(tmp_path / "d"),
            "--set", f"data.source={text_file}", "--dry-run"]
    assert main(args + ["--flops-per-s", "1e9"]) == 0
    text = capsys.readouterr().out
    assert "ladder smoke: 6 runs" in text and "hgrn2-m" in text and "PFLOP/s-days" in text
    assert "max epochs" in text and "from 1e+09 FLOP/s" in text
    assert not (tmp_path / "d" / "runs").exists()  # nothing trained, nothing written
    assert main(args[:-1] + ["--dry-run"]) == 0  # timed on this machine
    cap = capsys.readouterr()
    assert "timed now on this machine" in cap.out and "n/a" not in cap.out.split("estimated time")[-1]
    # The smallest and largest rung of each architecture are timed; the middle one is interpolated.
    assert sorted(x.split()[1] for x in cap.err.splitlines() if x.startswith("timing")) == [
        "hgrn2-m", "hgrn2-xs", "llama-m", "llama-xs"]


def test_emit_torchrun_for_the_paper_ladder(tmp_path, capsys):
    from linlm.train.config_sources import build_config

    out = tmp_path / "paper"
    assert main(["scaling", "run", "--ladder", "paper", "--out", str(out), "--emit", "torchrun"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    cmds = [x for x in lines if x.startswith("torchrun ")]
    assert len(cmds) == 6 * len(arch_names(scaling_study=True)) and sum(x.startswith("# rung") for x in lines) == 6
    assert len(arch_names(scaling_study=True)) == 9  # the 2024 study's four, Mamba-2, GLA, RetNet, the delta rule's two
    assert all("-m linlm train --config" in c and c.endswith("--resume") for c in cmds)
    cfg = build_config(out / "configs" / "tnl-1b.yaml")
    assert (cfg.batch_size, cfg.data.seq_len, cfg.optim.lr, cfg.optim.weight_decay) == (480, 8192, 3e-4, 0.1)
    assert cfg.steps * 480 * 8192 >= 300e9 and cfg.model.preset == "paper-1b"
    meta = json.loads((out / "runs" / "llama-70m" / "scaling.json").read_text())
    assert meta["paper_flops_per_token"] * 480 * 8192 / 1e15 == pytest.approx(1.6, abs=0.05)  # the paper's 1.6 PFLOPs
    # The configs, the metas and the plan (which marks the directory as this ladder's sweep) are linlm's.
    assert outputs.owns_file(out / "configs" / "tnl-1b.yaml") and outputs.owns_file(out / "plan.json")
    assert json.loads((out / "plan.json").read_text())["ladder"] == "paper"
    assert main(["scaling", "run", "--ladder", "smoke", "--out", str(out), "--emit", "torchrun"]) == 2
    assert "holds a sweep of ladder 'paper', not 'smoke'" in capsys.readouterr().err


def write_ladder(path: Path, **rung) -> Path:
    data = {"name": "mine", "archs": ["llama", "tnl"], "train": {"data": {"seq_len": 32}, "batch_size": 4},
            "rungs": [{"name": "r0", "model": {"n_layers": 1, "d_model": 32, "n_heads": 2}, "tokens": 1024},
                      {"name": "r1", "model": rung.pop("model", {"n_layers": 1, "d_model": 48, "n_heads": 2}),
                       "tokens": rung.pop("tokens", 1024)}]}
    path.write_text(yaml.safe_dump(data))
    return path


def test_hand_written_ladder_and_a_rung_that_does_not_divide_into_heads(tmp_path):
    good = load_ladder(str(write_ladder(tmp_path / "good.yaml")))
    runs = plan_runs(good, None, tmp_path / "o")
    assert [r.name for r in runs] == ["llama-r0", "tnl-r0", "llama-r1", "tnl-r1"]
    assert runs[0].config.steps == 1024 // (4 * 32)
    bad = load_ladder(str(write_ladder(tmp_path / "bad.yaml", model={"n_layers": 1, "d_model": 100, "n_heads": 3})))
    with pytest.raises(ConfigError, match=r"ladder mine, rung 'r1', arch llama: .*d_model: 100 is not divisible by "
                                          r"n_heads=3"):
        plan_runs(bad, None, tmp_path / "o")


def test_too_many_epochs_are_refused(tmp_path, text_file, capsys):
    path = write_ladder(tmp_path / "long.yaml", tokens=50_000_000)
    args = ["scaling", "run", "--ladder", str(path), "--out", str(tmp_path / "o"), "--set",
            f"data.source={text_file}", "--set", "data.tokenizer=bpe:300", "--dry-run", "--no-measure"]
    assert main(args) == 2
    err = capsys.readouterr().err
    # Both rung-r1 runs are over (the same tokens of the same data): the count says so, and the worst of the tie
    # named is the first in the plan's order.
    assert "ladder mine: 2 run(s) would see their training data more than max_epochs=4 times (worst: llama-r1, " \
        in err, err


def test_unknown_ladder_arch_and_another_ladders_directory(tmp_path, text_file, capsys):
    assert set(builtin_ladders()) >= {"paper", "cpu", "smoke"}
    assert main(["scaling", "run", "--ladder", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown ladder 'nope'" in capsys.readouterr().err
    assert main(["scaling", "run", "--ladder", "smoke", "--archs", "llama,gpt", "--out", str(tmp_path)]) == 2
    assert "unknown architecture 'gpt'" in capsys.readouterr().err
    outputs.write_json(tmp_path / "plan.json", {"ladder": "cpu"})
    with pytest.raises(ConfigError, match="holds a sweep of ladder 'cpu'"):
        run_grid(load_ladder("smoke"), ["llama"], tmp_path, overrides={"data": {"source": str(text_file)}})


def test_cpu_ladder_shape():
    """Five sizes over more than a decade of non-embedding parameters at a short context, every arch, two runs at
    once; the smaller rungs train longer (past the compute where the next size overtakes them), the largest reaches
    the compute of the one below it, and no run sees its data more than max_epochs times (3.65M training tokens of
    Shakespeare at bpe:300)."""
    ladder = load_ladder("cpu")
    runs = plan_runs(ladder, None, "/tmp/unused")
    assert len(ladder.rungs) == 5 and len(runs) == 5 * len(arch_names(scaling_study=True)) and ladder.jobs == 2
    params = [r.params for r in runs]
    assert 0.01e6 < min(params) < 0.03e6 and 0.3e6 < max(params) < 0.6e6
    assert all(r.config.data.seq_len <= 256 and r.config.data.tokenizer == "bpe:300" for r in runs)
    tokens = [rung.tokens for rung in ladder.rungs]
    assert tokens == sorted(tokens, reverse=True) and tokens[0] >= 2 * tokens[-1]
    assert max(tokens) <= ladder.max_epochs * 3.6e6
    for arch in ladder.archs:
        mine = [r for r in runs if r.arch == arch]
        assert mine[-1].compute >= mine[-2].compute  # the top rung brackets the one below over its whole range


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(root.rglob("*"))}


def test_a_directory_that_is_no_sweep_of_the_ladder_is_refused_unchanged(tmp_path, text_file):
    ladder = load_ladder("smoke")
    over = {"data": {"source": str(text_file)}}
    user_run = tmp_path / "my_run"  # what `linlm train` leaves: no plan.json
    user_run.mkdir()
    (user_run / "config.yaml").write_text("steps: 10\n")
    (user_run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    handwritten = tmp_path / "hand"  # a plan.json of the user's is no sweep of linlm's
    handwritten.mkdir()
    (handwritten / "plan.json").write_text(json.dumps({"ladder": "smoke"}))
    outputs.write_json(handwritten / "other.json", {})
    a_file = tmp_path / "file"
    a_file.write_text("x")
    cases = [(user_run, OutputError, "did not write"), (handwritten, ConfigError, "plan.json there was not written"),
             (a_file, StorageError, "is a file"), (a_file / "sub", StorageError, "is a file")]
    before = _snapshot(tmp_path)
    for path, error, match in cases:
        with pytest.raises(error, match=match):
            run_grid(ladder, ["llama"], path, overrides=over, say=lambda s: None)
    from linlm.scaling.sweepdir import check_sweep_dir

    with pytest.raises(ConfigError, match="--scaling-dir .*typo: does not exist"):
        check_sweep_dir(tmp_path / "typo", ladder, "--scaling-dir", must_exist=True)
    assert _snapshot(tmp_path) == before
    outputs.write_json(user_run / "summary.json", {"step": 10})  # a ledger now, but still no sweep
    with pytest.raises(ConfigError, match="is no sweep of `linlm scaling run`"):
        check_sweep_dir(user_run, ladder, "--scaling-dir")


def test_runs_started_with_other_settings_refuse_the_sweep_before_anything_is_written(tmp_path, text_file, capsys):
    """A finished run trained with another learning rate would be skipped as done and fitted beside runs trained
    with this one; the runner refuses before it writes anything (the lock file included)."""
    ladder = load_ladder("smoke")
    out = tmp_path / "sweep"
    old = plan_runs(ladder, ["llama"], out, {"data": {"source": str(text_file)}, "optim": {"lr": 0.02}})
    outputs.write_json(out / "plan.json", {"ladder": "smoke", "archs": ["llama"], "runs": [r.name for r in old]})
    outputs.write_text(out / "runs" / old[0].name / "config.yaml", old[0].config.to_yaml())
    outputs.write_json(out / "runs" / old[0].name / "summary.json", {"step": old[0].config.steps})
    before = _snapshot(out)
    args = ["scaling", "run", "--ladder", "smoke", "--archs", "llama", "--out", str(out), "--set",
            f"data.source={text_file}", "--set", "optim.lr=0.03"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "run llama-xs there was started with a different optim.lr" in err and "Traceback" not in err
    assert _snapshot(out) == before
