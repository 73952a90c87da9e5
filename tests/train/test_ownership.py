"""A run directory holds linlm's files and the user's: `train --overwrite` and a demo replacing its own run remove
only what linlm wrote (the ledger says which), a user's path where the run writes refuses the command with nothing
changed, and every file the trainer writes is recorded as linlm's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from train_helpers import run_cli, write_yaml

from linlm import outputs
from linlm.errors import OutputError
from linlm.train import TrainConfig, TrainHooks, train
from linlm.train.metrics import read_metrics

RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "samples.txt", "loss_curve.png")


def state(root: Path) -> dict:
    """Every path under root, a file with its bytes (the lock file and the ledgers included): what 'byte for byte
    unchanged' compares."""
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def under(snapshot: dict, *prefixes: str) -> dict:
    return {k: v for k, v in snapshot.items() if k.startswith(prefixes)}


def place_users_paths(out: Path) -> tuple[str, ...]:
    """A user's folders and files inside a finished run, and a `cp -r` copy of one of its checkpoints; returns
    their paths relative to out."""
    ck = out / "checkpoints"
    (ck / "best_keep").mkdir()
    (ck / "best_keep" / "weights.bin").write_bytes(b"the user's best weights")
    (ck / "best_keep" / "why.txt").write_text("lowest val loss\n")
    shutil.copytree(ck / "step_00000004", ck / "step4_copy")
    (ck / "README.md").write_text("my notes on these checkpoints\n")
    (out / "notes.txt").write_text("my notes\n")
    (out / "analysis").mkdir()
    (out / "analysis" / "fig.png").write_bytes(b"\x89PNG the user's figure")
    return ("checkpoints/best_keep", "checkpoints/step4_copy", "checkpoints/README.md", "notes.txt", "analysis")


def one_line_refusal(done) -> str:
    errors = [line for line in done.stderr.splitlines() if line.startswith("linlm: error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    return errors[0]


# ---- train --overwrite --------------------------------------------------------------------------------------------


def test_overwrite_removes_only_what_linlm_wrote(make_config, tmp_path):
    cfg = make_config("run", steps=4)
    train(cfg, verbose=False)
    out = Path(cfg.out_dir)
    users = place_users_paths(out)
    before = under(state(out), *users)
    path = write_yaml(tmp_path / "cfg.yaml", {**cfg.to_dict(), "seed": 1})
    done = run_cli(["train", "--config", str(path), "--overwrite", "--quiet"], timeout=300)
    assert done.returncode == 0, done.stderr
    assert under(state(out), *users) == before  # kept byte for byte, the copy of a checkpoint included
    # ... and the old run was replaced by the new one
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert "seed: 1" in (out / "config.yaml").read_text()
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_")) == [
        "step_00000002", "step_00000004"]


def _edit(out: Path, rel: str) -> None:
    (out / rel).write_bytes(b"the user's version\n")


def _checkpoints_file(out: Path) -> None:
    shutil.rmtree(out / "checkpoints")
    (out / "checkpoints").write_text("a file of the user's named checkpoints\n")


def _users_checkpoint(out: Path) -> None:
    (out / "checkpoints" / "step_00000006").mkdir()
    (out / "checkpoints" / "step_00000006" / "weights.bin").write_bytes(b"the user's")


def _inside_a_checkpoint(out: Path) -> None:
    (out / "checkpoints" / "step_00000002" / "notes.txt").write_text("mine, inside linlm's checkpoint\n")


BLOCKERS = {
    **{name: (lambda out, name=name: _edit(out, name)) for name in RUN_FILES},  # samples.txt: the run wrote none
    "checkpoints": _checkpoints_file,
    "checkpoints/step_00000006": _users_checkpoint,
    "checkpoints/step_00000004/state.json": lambda out: _edit(out, "checkpoints/step_00000004/state.json"),
    "checkpoints/step_00000002/notes.txt": _inside_a_checkpoint,
}


@pytest.mark.parametrize("blocker", list(BLOCKERS))
def test_a_users_path_where_the_new_run_writes_refuses_overwrite_and_changes_nothing(make_config, tmp_path,
                                                                                     blocker):
    cfg = make_config("run", steps=4)
    train(cfg, verbose=False)
    out = Path(cfg.out_dir)
    BLOCKERS[blocker](out)
    if blocker != "checkpoints":
        place_users_paths(out)
    before = state(out)
    if blocker == "config.yaml":  # the command line: one line, exit 2
        path = write_yaml(tmp_path / "cfg.yaml", cfg.to_dict())
        error = one_line_refusal(run_cli(["train", "--config", str(path), "--overwrite", "--quiet"], timeout=300))
    else:  # the same refusal, from the library (faster)
        with pytest.raises(OutputError) as e:
            train(cfg, overwrite=True, verbose=False)
        error = str(e.value)
    assert str(out / blocker) in error and "nothing was removed" in error and "\n" not in error
    assert state(out) == before  # nothing removed or trained; not even the lock file was touched


# ---- linlm demo ---------------------------------------------------------------------------------------------------


def demo_args(data_dir: Path, out: Path) -> list[str]:
    """`linlm demo` arguments that train the demo's architecture at a tiny size on the test data in seconds."""
    sets = {"data.dir": data_dir, "data.seq_len": 32, "batch_size": 4, "model.overrides.n_layers": 1,
            "model.overrides.d_model": 32, "model.overrides.n_heads": 2, "model.overrides.glu_dim": 64,
            "model.overrides.chunk_size": 16, "eval.batches": 1, "samples.max_new_tokens": 0, "precision": "fp32",
            "checkpoint.every": 1}
    return ["--out", str(out), *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]


def test_the_demo_replacing_its_run_keeps_the_users_folder_and_refuses_a_users_path(tiny_data, tmp_path):
    from linlm.commands.demo import DEMO_MARK, run_demo

    out = tmp_path / "demo"
    args = demo_args(tiny_data, out)
    sets = [args[i + 1] for i in range(2, len(args), 2)]
    run_demo(out_dir=str(out), steps=2, overrides=sets)
    assert outputs.owns_file(out / DEMO_MARK)
    (out / "checkpoints" / "keep_me").mkdir()
    (out / "checkpoints" / "keep_me" / "model.safetensors").write_bytes(b"the user's weights")
    (out / "notes.txt").write_text("my notes\n")
    before = under(state(out), "checkpoints/keep_me", "notes.txt")
    done = run_cli(["demo", "--steps", "2", *args], timeout=300)
    assert done.returncode == 0, done.stderr
    assert under(state(out), "checkpoints/keep_me", "notes.txt") == before
    assert outputs.owns_file(out / DEMO_MARK) and [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]
    # A file of linlm's that the user changed is in the way of the next replacement: refused, nothing changed.
    (out / "loss_curve.png").write_bytes(b"the user's own plot")
    before = state(out)
    error = one_line_refusal(run_cli(["demo", "--steps", "2", *args], timeout=300))
    assert "loss_curve.png" in error and state(out) == before


@pytest.mark.parametrize("steps", ["0", "-3"])
def test_demo_steps_zero_is_refused_not_read_as_the_default(tiny_data, tmp_path, steps):
    out = tmp_path / "demo"
    error = one_line_refusal(run_cli(["demo", "--steps", steps, *demo_args(tiny_data, out)], timeout=300))
    assert "steps" in error and not out.exists()


# ---- what the trainer writes ------------------------------------------------------------------------------------


def test_every_file_the_trainer_writes_is_recorded_as_linlms(make_config):
    cfg = make_config("run", steps=4, samples__prompts=["The king"], samples__max_new_tokens=3)
    train(cfg, verbose=False)
    out = Path(cfg.out_dir)
    for name in RUN_FILES:
        assert outputs.owns_file(out / name), name
    assert "head_sha256" in outputs.read_ledger(out).entries["metrics.jsonl"]  # recorded as an append-only log
    steps = sorted((out / "checkpoints").glob("step_*"))
    assert outputs.owns_dir(out / "checkpoints") and [p.name for p in steps] == ["step_00000002", "step_00000004"]
    assert all(outputs.owns_dir(p) and not outputs.foreign_entries(p) for p in steps)
    # A resume that drops the log's lines past its checkpoint leaves a log that is still linlm's.
    (out / "checkpoints" / "step_00000004").rename(out / "checkpoints" / "moved_by_the_user")
    resumed = train(TrainConfig.from_dict(cfg.to_dict()), resume=True, verbose=False)
    assert resumed.finished and [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert outputs.owns_file(out / "metrics.jsonl") and outputs.owns_file(out / "summary.json")
    assert (out / "checkpoints" / "moved_by_the_user" / "model.safetensors").is_file()


@pytest.mark.parametrize("name", ["summary.json", "loss_curve.png"])
def test_a_users_file_that_appears_during_the_run_is_refused_never_replaced(make_config, name):
    cfg = make_config("run", steps=3)

    class UserWritesDuringTheRun(TrainHooks):
        def on_step(self, record: dict) -> None:
            if record["step"] == 2:
                (Path(cfg.out_dir) / name).write_text("the user's\n")

    with pytest.raises(OutputError, match=name):
        train(cfg, verbose=False, hooks=UserWritesDuringTheRun())
    assert (Path(cfg.out_dir) / name).read_text() == "the user's\n"
