"""linlm reproduce's rules, with the section runners replaced by stand-ins (tests/reproduce/conftest.py): what
--overwrite removes and keeps, refusals that change nothing (the lock file included), one-line errors, settings
corrected in a job that has not finished, and sections saved only when they really finished."""

from __future__ import annotations

import builtins
import errno
import json
import os
from pathlib import Path

import pytest
from reproduce_helpers import hold_lock, snapshot, task_dir

from linlm import outputs
from linlm.cli import main


def reproduce(capsys, *args) -> tuple[int, str, str]:
    rc = main(["reproduce", *map(str, args)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def assert_one_line_error(rc: int, err: str, *needles: str) -> str:
    assert rc == 2, err
    lines = [x for x in err.splitlines() if x.startswith("linlm: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def job(tmp_path, fakes, capsys) -> Path:
    """A finished smoke job (every section but zero-shot, which had no --data-dir) in tmp/job."""
    out = tmp_path / "job"
    rc, _, err = reproduce(capsys, "--out", out)
    assert rc == 0, err
    assert (out / "sections" / "scaling.json").is_file() and (out / "scaling" / "plan.json").is_file()
    fakes.calls.clear()
    fakes.trained.clear()
    return out


# ---- --overwrite: only what linlm wrote ------------------------------------------------------------------------


def test_overwrite_removes_what_linlm_wrote_and_keeps_every_user_file(job, fakes, capsys):
    mine = {"plots/my_figure.png": b"my plot", "sections/notes.txt": b"my notes", "notes.md": b"mine"}
    for rel, data in mine.items():
        (job / rel).write_bytes(data)
    rc, _, err = reproduce(capsys, "--out", job, "--overwrite")
    assert rc == 0, err
    for rel, data in mine.items():
        assert (job / rel).read_bytes() == data, rel
    # The job started over: both sweeps trained again and every section ran instead of being read back.
    assert [t[0] for t in fakes.trained] == ["smoke", "compare-smoke"]
    assert {"fits", "mqar", "decode"} <= set(fakes.calls)
    assert outputs.owns_file(job / "report.md") and outputs.owns_file(job / "sections" / "scaling.json")


IN_THE_WAY = [("scaling/notes.txt", "notes.txt"), ("compare/runs/llama-s/mine.txt", "mine.txt"),
              ("mqar/keep.txt", "mqar"),  # a folder of the user's where MQAR writes
              ("sections/mqar.json", "mqar.json"), ("report.md", "report.md")]


@pytest.mark.parametrize("rel, named", IN_THE_WAY)
def test_overwrite_refuses_a_user_path_in_the_way_and_removes_nothing(job, capsys, rel, named):
    (job / rel).parent.mkdir(parents=True, exist_ok=True)
    (job / rel).write_bytes(b"mine, and longer than what linlm wrote there")
    before = snapshot(job)
    rc, _, err = reproduce(capsys, "--out", job, "--overwrite")
    assert_one_line_error(rc, err, named)
    assert snapshot(job) == before


def test_overwrite_never_clears_a_sweep_another_process_holds(job, capsys):
    holder = hold_lock(job / "scaling")
    try:
        before = snapshot(job)
        rc, _, err = reproduce(capsys, "--out", job, "--overwrite")
        assert_one_line_error(rc, err, f"PID {holder.pid}")
        assert snapshot(job) == before
    finally:
        holder.kill()
        holder.wait()
    rc, _, err = reproduce(capsys, "--out", job, "--overwrite")  # the holder is gone: its stale lock does not block
    assert rc == 0, err


def test_a_scaling_dir_another_process_trains_in_is_refused(tmp_path, fakes, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    holder = hold_lock(sweep)
    try:
        before = snapshot(sweep)
        rc, _, err = reproduce(capsys, "--out", tmp_path / "job", "--scaling-dir", sweep)
        assert_one_line_error(rc, err, "--scaling-dir", f"PID {holder.pid}")
        assert snapshot(sweep) == before and not (tmp_path / "job").exists() and not fakes.trained
    finally:
        holder.kill()
        holder.wait()


def test_overwrite_never_removes_the_scaling_dir(tmp_path, fakes, capsys):
    sweep, out = tmp_path / "sweep", tmp_path / "job"
    sweep.mkdir()
    rc, _, err = reproduce(capsys, "--out", out, "--scaling-dir", sweep)
    assert rc == 0, err
    assert (sweep / "plan.json").is_file() and not (out / "scaling").exists()
    before = snapshot(sweep)
    rc, _, err = reproduce(capsys, "--out", out, "--overwrite")
    assert rc == 0, err
    assert snapshot(sweep) == before  # the sweep the job was given is not the job's to remove
    assert json.loads((out / "reproduce.json").read_text())["scaling_dir"] is None  # started over: its own sweep


# ---- refusals change nothing -----------------------------------------------------------------------------------


def _user_run(path: Path) -> Path:
    """A training run of the user's (what `linlm train` leaves), given as if it were a sweep."""
    path.mkdir()
    (path / "config.yaml").write_text("steps: 10\n")
    (path / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    return path


def _other_ladder(path: Path) -> Path:
    outputs.write_json(path / "plan.json", {"ladder": "cpu", "archs": ["llama"], "runs": []})
    return path


# (arguments after --out, what the one line names); "{t}" is the test's tmp_path.
ON_A_JOB = {
    "another recipe": (["--recipe", "cpu"], "recipe 'smoke'"),
    "a typo in --set": (["--set", "optim.lrr=1"], "--set"),
    "a --set the finished sections contradict": (["--set", "optim.lr=0.5"], "scaling, compare"),
    "a missing --data-dir": (["--data-dir", "{t}/no-tasks"], "--data-dir"),
    "a --data-dir without task files": (["--data-dir", "{t}"], "holds none of the task files"),
    "--resume with --overwrite": (["--resume", "--overwrite"], "contradict"),
    "--train-here on a local recipe": (["--train-here"], "--train-here"),
}
ON_A_NEW_DIR = {
    "an unknown recipe": (["--recipe", "laptop"], "unknown recipe"),
    "a typo in --set": (["--set", "optim.lrr=1"], "optim.lrr"),
    "a --scaling-dir that does not exist": (["--scaling-dir", "{t}/typo"], "--scaling-dir"),
    "a --scaling-dir of another ladder": (["--scaling-dir", "{t}/other"], "ladder 'cpu'"),
    "a --scaling-dir that is a user's run": (["--scaling-dir", "{t}/run"], "--scaling-dir"),
    "an --out inside the --scaling-dir": (["--scaling-dir", "{t}/empty", "--out", "{t}/empty/job"], "inside"),
    "--resume with nothing to resume": (["--resume"], "--resume"),
}


def _args(args: list[str], tmp_path: Path) -> list[str]:
    return [a.replace("{t}", str(tmp_path)) for a in args]


@pytest.mark.parametrize("case", list(ON_A_JOB))
def test_a_refusal_on_a_job_changes_nothing_not_even_the_lock(job, tmp_path, fakes, capsys, case):
    args, needle = ON_A_JOB[case]
    assert (job / ".lock").is_file()
    before = snapshot(job)
    rc, _, err = reproduce(capsys, "--out", job, *_args(args, tmp_path))
    assert_one_line_error(rc, err, needle)
    assert snapshot(job) == before and not fakes.calls and not fakes.trained


@pytest.mark.parametrize("case", list(ON_A_NEW_DIR))
def test_a_refusal_creates_nothing(tmp_path, fakes, capsys, case):
    args, needle = ON_A_NEW_DIR[case]
    _user_run(tmp_path / "run")
    _other_ladder(tmp_path / "other")
    (tmp_path / "empty").mkdir()
    before = snapshot(tmp_path)
    rc, _, err = reproduce(capsys, "--out", tmp_path / "job", *_args(args, tmp_path))  # a later --out wins
    assert_one_line_error(rc, err, needle)
    assert snapshot(tmp_path) == before and not fakes.calls and not fakes.trained


def test_a_directory_of_someone_elses_files_is_refused_unchanged(tmp_path, fakes, capsys):
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "thesis.tex").write_text("mine")
    for flags in ([], ["--resume"], ["--overwrite"]):
        before = snapshot(out)
        rc, _, err = reproduce(capsys, "--out", out, *flags)
        assert_one_line_error(rc, err, "did not write")
        assert snapshot(out) == before


# ---- one-line errors -------------------------------------------------------------------------------------------


def test_an_out_under_a_file_or_unwritable_is_one_line(tmp_path, fakes, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    for out in (f / "sub", Path("/proc/linlm-reproduce-test")):
        rc, _, err = reproduce(capsys, "--out", out)
        assert_one_line_error(rc, err, "--out")
    assert f.read_text() == "x" and not fakes.calls


def test_a_full_disk_while_logging_a_failed_section_is_one_line(tmp_path, fakes, capsys, monkeypatch):
    fakes.fail_training = "early"
    real_open = builtins.open

    def full(file, mode="r", *args, **kwargs):
        if str(file).endswith("errors.log") and "a" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full)
    rc, _, err = reproduce(capsys, "--out", tmp_path / "job")
    assert_one_line_error(rc, err, "errors.log", "No space left on device")


# ---- settings are checked up front, and corrected while a job has not finished ----------------------------------


def test_a_typo_in_set_is_refused_before_any_work_and_never_stored(tmp_path, fakes, capsys):
    out = tmp_path / "job"
    rc, _, err = reproduce(capsys, "--out", out, "--set", "optim.lrr=1")
    assert_one_line_error(rc, err, "--set", "optim.lrr", "did you mean 'lr'")
    assert not out.exists() and not fakes.trained and not fakes.calls


def _marker(out: Path) -> dict:
    return json.loads((out / "reproduce.json").read_text())


def test_the_settings_of_an_unfinished_job_can_be_corrected(tmp_path, fakes, capsys):
    out, bad, good = tmp_path / "job", tmp_path / "missing.txt", tmp_path / "corpus.txt"
    fakes.fail_training = "early"
    rc, stdout, _ = reproduce(capsys, "--out", out, "--set", f"data.source={bad}")
    assert rc == 2 and "failed sections: scaling, compare" in stdout  # a job with failed sections is not done
    assert _marker(out)["overrides"] == {"data": {"source": str(bad)}}
    # A typo stored by an older linlm is refused, naming where it came from, and a corrected --set is taken.
    outputs.write_json(out / "reproduce.json", {**_marker(out), "overrides": {"optim": {"lrr": 1}}})
    before = snapshot(out)
    rc, _, err = reproduce(capsys, "--out", out)
    assert_one_line_error(rc, err, "optim.lrr", "kept from the job's reproduce.json")
    assert snapshot(out) == before
    fakes.fail_training = None
    rc, _, err = reproduce(capsys, "--out", out, "--set", f"data.source={good}")
    assert rc == 0, err
    assert "--set: the job ran with --set optim.lrr=1; from now on --set data.source=" in err
    assert fakes.trained[-1][2] == {"data": {"source": str(good)}}  # the failed sections ran with the new --set
    assert _marker(out)["overrides"] == {"data": {"source": str(good)}}
    assert (out / "sections" / "scaling.json").is_file()
    # Now finished: another --set is refused, naming the sections it would contradict, and nothing changes.
    before = snapshot(out)
    rc, _, err = reproduce(capsys, "--out", out, "--set", f"data.source={bad}")
    assert_one_line_error(rc, err, "--set", "scaling, compare, fits", "--overwrite")
    assert snapshot(out) == before
    rc, _, err = reproduce(capsys, "--out", out)  # the same command without --set continues with the job's
    assert rc == 0, err


def test_a_corrected_scaling_dir_is_taken_while_the_sweep_has_not_finished(tmp_path, fakes, capsys):
    out, first, second = tmp_path / "job", tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    fakes.fail_training = "early"
    rc, _, err = reproduce(capsys, "--out", out, "--scaling-dir", first)
    assert rc == 2, err  # the training sections failed
    fakes.fail_training = None
    rc, _, err = reproduce(capsys, "--out", out, "--scaling-dir", second)
    assert rc == 0, err
    assert _marker(out)["scaling_dir"] == str(second.resolve())
    assert fakes.trained[-2][1] == str(second.resolve())  # the scaling sweep trained in the new directory
    rc, _, err = reproduce(capsys, "--out", out, "--scaling-dir", first)
    assert_one_line_error(rc, err, "--scaling-dir", "scaling")


def test_a_changed_set_is_refused_when_runs_of_the_sweep_started_with_the_old_one(tmp_path, fakes, capsys):
    out = tmp_path / "job"
    fakes.fail_training = "late"  # every run's config.yaml written, then a failure: runs started, none done
    assert reproduce(capsys, "--out", out, "--set", "optim.lr=0.02")[0] == 2  # the training sections failed
    before = snapshot(out)
    rc, _, err = reproduce(capsys, "--out", out, "--set", "optim.lr=0.03")
    assert_one_line_error(rc, err, "was started with a different optim.lr")
    assert snapshot(out) == before


# ---- outcomes: saved only when finished -------------------------------------------------------------------------


def test_zeroshot_that_scored_nothing_failed_and_a_corrected_data_dir_runs_it(tmp_path, fakes, capsys):
    bad, good, out = task_dir(tmp_path / "bad", "bad"), task_dir(tmp_path / "good", "good"), tmp_path / "job"
    rc, stdout, err = reproduce(capsys, "--out", out, "--data-dir", bad)
    assert rc == 2, err
    assert "failed sections: zeroshot" in stdout and not (out / "sections" / "zeroshot.json").exists()
    assert "no task was scored" in (out / "errors.log").read_text()
    assert "This section failed" in (out / "report.md").read_text()
    rc, _, err = reproduce(capsys, "--out", out, "--data-dir", good)
    assert rc == 0, err
    used = str(good.resolve())
    assert json.loads((out / "sections" / "zeroshot.json").read_text())["data_dir"] == used
    assert _marker(out)["data_dir"] == used
    md = (out / "report.md").read_text()
    assert used in md and str(bad) not in md
    before = snapshot(out)
    rc, _, err = reproduce(capsys, "--out", out, "--data-dir", bad)  # finished: never recomputed silently
    assert_one_line_error(rc, err, "--data-dir", "zeroshot")
    assert snapshot(out) == before


def test_the_paper_recipe_trains_nothing_here(tmp_path, fakes, capsys):
    out = tmp_path / "paper"
    rc, stdout, err = reproduce(capsys, "--recipe", "paper", "--out", out)
    assert rc == 0, err
    assert not fakes.trained and "mqar" not in fakes.calls
    assert "mqar: not run yet" in stdout and "--train-here" in stdout
    script = out / "torchrun.sh"
    from linlm.scaling.ladder import load_ladder

    ladder = load_ladder("paper")  # a job per (architecture, size) of the ladder, then the comparison's 3 at 410M
    assert os.access(script, os.X_OK)
    assert script.read_text().count("torchrun ") == len(ladder.archs) * len(ladder.rungs) + 3
    assert outputs.owns_file(script) and outputs.owns_file(out / "scaling" / "configs" / "llama-7b.yaml")
    assert "--train-here" in (out / "report.md").read_text()
    rc, stdout, err = reproduce(capsys, "--recipe", "paper", "--out", out, "--train-here")
    assert rc == 0, err
    assert fakes.calls.count("mqar") == 1 and not fakes.trained


def test_an_overwrite_cut_short_is_finished_by_the_next_overwrite(job, capsys):
    """Killed while it removes the old job's files, --overwrite leaves the marker saying so: a plain rerun is
    refused (it would continue a half-removed job) and the next --overwrite finishes the work."""
    real = outputs.remove_tree

    def killed_after(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt  # the removal is done, the new job not yet started

    with pytest.MonkeyPatch.context() as mp:  # its own: undoing it leaves the stand-in sections in place
        mp.setattr(outputs, "remove_tree", killed_after)
        assert reproduce(capsys, "--out", job, "--overwrite")[0] == 130
    assert _marker(job)["replacing"] and not (job / "sections" / "scaling.json").exists()
    before = snapshot(job)
    rc, _, err = reproduce(capsys, "--out", job)
    assert_one_line_error(rc, err, "--overwrite again")
    assert snapshot(job) == before
    rc, _, err = reproduce(capsys, "--out", job, "--overwrite")
    assert rc == 0, err
    assert "replacing" not in _marker(job) and (job / "sections" / "scaling.json").is_file()


def test_a_second_job_on_a_directory_a_live_job_holds_is_refused_unchanged(job, capsys):
    holder = hold_lock(job)
    try:
        before = snapshot(job)
        for flags in ([], ["--overwrite"]):
            rc, _, err = reproduce(capsys, "--out", job, *flags)
            assert_one_line_error(rc, err, f"PID {holder.pid}")
            assert snapshot(job) == before
    finally:
        holder.kill()
        holder.wait()
