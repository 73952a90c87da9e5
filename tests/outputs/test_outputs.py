"""linlm.outputs: the one rule for every path linlm writes. A user's file is never replaced or removed, a refusal
changes nothing, an unwritable path is one line, and a locked directory is never cleared."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from output_asserts import hold_lock

from linlm import outputs
from linlm.errors import LockedError, OutputError, StorageError


def snapshot(root: Path) -> dict:
    """Every file and directory under root with its bytes: what 'changes nothing' compares."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def tree(tmp_path: Path) -> Path:
    """A tree written by linlm: out/{a.json, plots/x.png, deep/er/c.txt, log.txt (appended)}."""
    out = tmp_path / "out"
    outputs.write_json(out / "a.json", {"x": 1})
    outputs.write_bytes(out / "plots" / "x.png", b"\x89PNG fake")
    outputs.write_text(out / "deep" / "er" / "c.txt", "linlm\n")
    outputs.append_text(out / "log.txt", "one\n")
    outputs.append_text(out / "log.txt", "two\n")
    return out


def test_written_files_are_linlms_and_can_be_rewritten(tmp_path):
    out = tree(tmp_path)
    for rel in ("a.json", "plots/x.png", "deep/er/c.txt", "log.txt"):
        assert outputs.owns_file(out / rel), rel
    for d in (out, out / "plots", out / "deep", out / "deep" / "er"):
        assert outputs.owns_dir(d), d
    assert outputs.check_file(out / "a.json") == out / "a.json"
    outputs.write_json(out / "a.json", {"x": 2})
    assert (out / "a.json").read_text() == '{\n "x": 2\n}\n' and outputs.owns_file(out / "a.json")
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_a_users_file_is_refused_before_and_at_the_write(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("my notes")
    before = snapshot(tmp_path)
    with pytest.raises(OutputError, match="linlm did not write it"):
        outputs.check_file(target, "--json")
    with pytest.raises(OutputError, match="--json .*results.json"):
        outputs.write_json(target, {"a": 1}, "--json")
    assert snapshot(tmp_path) == before


def test_a_file_the_user_edited_is_theirs_and_a_copy_stays_linlms(tmp_path):
    out = tree(tmp_path)
    time.sleep(0.01)
    (out / "a.json").write_text('{"x": 1, "mine": true}\n')
    assert not outputs.owns_file(out / "a.json")
    with pytest.raises(OutputError):
        outputs.write_json(out / "a.json", {"x": 3})
    assert "mine" in (out / "a.json").read_text()
    # A copy of the tree under the same name (new mtimes) is still linlm's, file by file.
    copy = tmp_path / "elsewhere" / "out"
    shutil.copytree(out, copy, copy_function=shutil.copyfile)
    assert outputs.owns_file(copy / "plots" / "x.png") and outputs.owns_dir(copy / "plots")
    # A directory copied or renamed to a new name is the user's.
    shutil.copytree(out / "plots", out / "plots_keep")
    (out / "deep").rename(out / "deep_keep")
    assert not outputs.owns_dir(out / "plots_keep") and not outputs.owns_dir(out / "deep_keep")


def test_a_log_replaced_by_the_user_is_refused(tmp_path):
    out = tree(tmp_path)
    (out / "log.txt").write_text("someone else's log\n")
    with pytest.raises(OutputError):
        outputs.append_text(out / "log.txt", "three\n")
    assert (out / "log.txt").read_text() == "someone else's log\n"


@pytest.mark.parametrize("case", ["under_a_file", "directory", "symlink", "proc"])
def test_unusable_targets_are_one_line_errors(tmp_path, case):
    blocker = tmp_path / "a-file"
    blocker.write_text("keep\n")
    if case == "under_a_file":
        target, error = blocker / "x.json", StorageError
    elif case == "directory":
        (tmp_path / "d").mkdir()
        target, error = tmp_path / "d", OutputError
    elif case == "symlink":
        target, error = tmp_path / "link.json", OutputError
        target.symlink_to(blocker)
    else:
        if not Path("/proc/self").is_dir():
            pytest.skip("no /proc here")
        target, error = Path("/proc/linlm-test/x.json"), StorageError
    before = snapshot(tmp_path)
    for call in (lambda: outputs.check_file(target, "--json"), lambda: outputs.write_json(target, {}, "--json")):
        with pytest.raises(error) as e:
            call()
        assert "\n" not in str(e.value) and "--json" in str(e.value)
    assert snapshot(tmp_path) == before


def test_check_dir(tmp_path):
    users = tmp_path / "users"
    users.mkdir()
    (users / "thesis.tex").write_text("mine")
    with pytest.raises(OutputError, match="thesis.tex"):
        outputs.check_dir(users, "--out")
    (tmp_path / "empty").mkdir()
    assert outputs.check_dir(tmp_path / "empty", "--out") == tmp_path / "empty"
    assert outputs.check_dir(tmp_path / "new" / "deeper", "--out") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()
    # A user's empty folder in which linlm made directories (and wrote no file of its own yet) is linlm's to use.
    outputs.write_json(tmp_path / "empty" / "run-a" / "a.json", {})
    assert outputs.check_dir(tmp_path / "empty", "--out") == tmp_path / "empty"
    (tmp_path / "empty" / "mine").mkdir()
    with pytest.raises(OutputError, match="mine/"):
        outputs.check_dir(tmp_path / "empty", "--out")
    out = tree(tmp_path)
    (out / "notes.txt").write_text("mine")  # a user's file in linlm's directory, at a name linlm does not write
    outputs.check_dir(out, "--out", names=["a.json", "plots/x.png", "report.md"])
    (out / "report.md").write_text("mine")
    with pytest.raises(OutputError, match="report.md"):
        outputs.check_dir(out, "--out", names=["a.json", "report.md"])
    with pytest.raises(StorageError, match="is a file"):
        outputs.check_dir(out / "a.json" / "sub", "--out")


def test_remove_tree_keeps_every_user_path(tmp_path):
    out = tree(tmp_path)
    (out / "plots" / "mine.png").write_bytes(b"user png")
    (out / "deep" / "er" / "notes").mkdir()
    (out / "deep" / "er" / "notes" / "n.txt").write_text("user")
    shutil.copytree(out / "plots", out / "best_keep")  # a copy of linlm's directory under the user's name
    (out / "user.txt").write_text("user")
    users = {k: v for k, v in snapshot(out).items() if k.startswith(("best_keep", "user.txt", "plots/mine.png",
                                                                      "deep/er/notes"))}
    kept = outputs.remove_tree(out)
    after = snapshot(out)
    assert {k: v for k, v in after.items() if k in users} == users
    assert not (out / "a.json").exists() and not (out / "log.txt").exists()
    assert not (out / "plots" / "x.png").exists() and (out / "plots" / "mine.png").exists()
    assert (out / "deep" / "er" / "notes" / "n.txt").exists() and not (out / "deep" / "er" / "c.txt").exists()
    assert sorted(p.name for p in kept) == ["best_keep", "mine.png", "notes", "user.txt"]
    # Directories that held only linlm's files are gone; those with the user's files stay.
    out2 = tree(tmp_path / "second")
    outputs.remove_tree(out2, keep_root=False)
    assert not out2.exists() and (tmp_path / "second").is_dir()


def test_remove_tree_refuses_a_path_in_the_way_and_changes_nothing(tmp_path):
    out = tree(tmp_path)
    (out / "report.md").write_text("mine")
    before = snapshot(out)
    with pytest.raises(OutputError, match="report.md"):
        outputs.remove_tree(out, "--overwrite", blocks=lambda rel: rel == "report.md")
    assert snapshot(out) == before
    time.sleep(0.01)
    (out / "a.json").write_text('{"edited": 1}')  # a file of linlm's the user changed: in the way of a rewrite
    before = snapshot(out)
    with pytest.raises(OutputError, match="a.json"):
        outputs.remove_tree(out, "--overwrite", refuse_edited=True)
    assert snapshot(out) == before


def test_a_directory_another_process_holds_is_never_cleared(tmp_path):
    out = tree(tmp_path)
    holder = hold_lock(out / "deep")
    try:
        before = snapshot(out)
        with pytest.raises(LockedError, match=f"PID {holder.pid}"):
            outputs.remove_tree(out, "--overwrite")
        assert snapshot(out) == before
    finally:
        holder.kill()
        holder.wait()
    outputs.remove_tree(out)  # the holder is gone: its stale lock does not block
    assert not (out / "deep").exists()


def test_a_full_disk_leaves_the_old_file_whole_and_no_temporary(tmp_path, monkeypatch):
    out = tree(tmp_path)
    import linlm.io_utils

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(linlm.io_utils.os, "fsync", full)
    with pytest.raises(StorageError, match="No space left on device") as e:
        outputs.write_json(out / "a.json", {"x": 9}, "--json")
    assert "\n" not in str(e.value)
    monkeypatch.undo()
    assert (out / "a.json").read_text() == '{\n "x": 1\n}\n' and outputs.owns_file(out / "a.json")
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_writers_in_several_processes_keep_every_entry(tmp_path):
    code = ("import sys; from pathlib import Path; from linlm import outputs\n"
            "for i in range(25): outputs.write_text(Path(sys.argv[1]) / f'{sys.argv[2]}-{i}.txt', str(i))")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), name], env=env) for name in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    names = [f"{n}-{i}.txt" for n in "ab" for i in range(25)]
    assert all(outputs.owns_file(tmp_path / n) for n in names)
    assert sorted(outputs.read_ledger(tmp_path).entries) == sorted(names)


def test_a_directory_that_is_replaced_keeps_the_users_files(tmp_path):
    target = tmp_path / "model"
    tmp = outputs.temp_dir_beside(target)
    (tmp / "w.bin").write_bytes(b"one")
    outputs.commit_dir(tmp, target)
    (target / "mine.txt").write_text("user")
    tmp = outputs.temp_dir_beside(target)
    (tmp / "w.bin").write_bytes(b"two")
    outputs.commit_dir(tmp, target)
    assert (target / "w.bin").read_bytes() == b"two" and not (target / "mine.txt").exists()
    (old,) = [p for p in tmp_path.iterdir() if p.name.endswith(".old")]
    assert (old / "mine.txt").read_text() == "user" and not (old / "w.bin").exists()


def test_the_checks_before_a_removal_change_nothing_not_even_a_lock_file(tmp_path):
    """check_removal (and remove_tree, which runs it first) probes every lock of the tree without writing one: a
    stale lock of a dead process is not rewritten with this PID when another directory of the tree is held."""
    out = tree(tmp_path)
    (out / ".lock").write_text("999999 elsewhere\n")  # left by a process that has died; walked first
    holder = hold_lock(out / "deep")
    try:
        before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
        with pytest.raises(LockedError, match=f"PID {holder.pid}"):
            outputs.remove_tree(out, "--overwrite")
        assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()} == before
        with pytest.raises(LockedError, match=f"PID {holder.pid}"):
            outputs.check_removal(out, "--overwrite")
        from linlm.locking import check_unlocked

        check_unlocked(out, "out")  # stale: free, and still not rewritten
        check_unlocked(out / "nowhere", "x")  # no lock file: free, and none is created
        assert (out / ".lock").read_text() == "999999 elsewhere\n" and not (out / "nowhere").exists()
        plan = outputs.check_removal(out, "--overwrite", held=[out / "deep"])  # a lock this process holds
        assert out / "a.json" in plan.files
    finally:
        holder.kill()
        holder.wait()


def test_remove_tree_spares_what_the_caller_rewrites_next(tmp_path):
    out = tree(tmp_path)
    kept = outputs.remove_tree(out, spare=lambda rel: rel in ("a.json", "deep/er/c.txt"))
    assert kept == []
    assert outputs.owns_file(out / "a.json") and outputs.owns_file(out / "deep" / "er" / "c.txt")
    assert not (out / "plots").exists() and not (out / "log.txt").exists()


@pytest.mark.parametrize("cut", ["before_the_rename", "after_the_rename"])
def test_a_write_cut_short_at_any_point_leaves_a_file_of_linlms(tmp_path, monkeypatch, cut):
    """A kill between recording a new version and renaming it into place (or between the rename and the final
    record) leaves the old or the new file, and either is linlm's: the next write may replace it."""
    from linlm.outputs import files

    path = tmp_path / "a.json"
    outputs.write_json(path, {"v": 1})

    class Killed(BaseException):
        pass

    def die(*args, **kwargs):
        raise Killed

    if cut == "before_the_rename":
        monkeypatch.setattr(files.os, "replace", die)
    else:
        monkeypatch.setattr(files, "settle", die)
    with pytest.raises(Killed):
        outputs.write_json(path, {"v": 2})
    monkeypatch.undo()
    assert path.read_text() == ('{\n "v": 1\n}\n' if cut == "before_the_rename" else '{\n "v": 2\n}\n')
    assert outputs.owns_file(path)
    outputs.write_json(path, {"v": 3})
    assert outputs.owns_file(path) and "next" not in outputs.read_ledger(tmp_path).entries["a.json"]


def test_check_removal_refuses_as_remove_tree_would_and_removes_nothing(tmp_path):
    out = tree(tmp_path)
    (out / "report.md").write_text("mine")
    before = snapshot(out)
    with pytest.raises(OutputError, match="report.md"):
        outputs.check_removal(out, "--overwrite", blocks=lambda rel: rel == "report.md")
    plan = outputs.check_removal(out, "--overwrite", blocks=lambda rel: rel == "other.md")
    assert snapshot(out) == before  # a check, never a removal
    assert out / "report.md" in plan.kept and out / "a.json" in plan.files


def test_remove_file_takes_only_a_file_linlm_wrote(tmp_path):
    out = tree(tmp_path)
    (out / "mine.txt").write_text("user")
    time.sleep(0.01)
    (out / "deep" / "er" / "c.txt").write_text("edited by the user\n")
    temporary = out / f".x.json.{'ab' * 16}.tmp"
    temporary.write_bytes(b"left by a crash")
    assert outputs.remove_file(out / "a.json") and not (out / "a.json").exists()
    assert "a.json" not in outputs.read_ledger(out).entries
    assert outputs.remove_file(temporary) and not temporary.exists()
    for kept in (out / "mine.txt", out / "deep" / "er" / "c.txt", out / outputs.LEDGER, out / "missing.txt"):
        assert not outputs.remove_file(kept)
    assert (out / "mine.txt").read_text() == "user" and (out / "deep" / "er" / "c.txt").exists()
    assert outputs.owns_file(out / "log.txt")  # the rest of the ledger is as it was


def test_make_dir_that_fails_part_way_leaves_no_directory(tmp_path, monkeypatch):
    import linlm.io_utils

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(linlm.io_utils.os, "fsync", full)
    with pytest.raises(StorageError, match="No space left on device"):
        outputs.make_dir(tmp_path / "new" / "deeper", "--out")
    monkeypatch.undo()
    assert not (tmp_path / "new").exists()
