"""The one record of the environment: its keys, the git revision (+dirty) and the CPU."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

import pytest
import torch

import linlm
from linlm.environment import BF16_FLAGS, cpu, environment, git_revision, git_state


def test_the_record_has_versions_machine_and_threads():
    env = environment()
    assert json.loads(json.dumps(env)) == env  # plain JSON
    assert env["linlm_version"] == linlm.__version__ and env["torch_version"] == torch.__version__
    assert env["python_version"] == platform.python_version()
    assert env["torch_num_threads"] == torch.get_num_threads() and env["cpu_count"] >= 1
    assert env["cpu_model"] == env["cpu"]["model_name"] and env["cpu_model"]
    assert (env["cuda"] is None) == (not torch.cuda.is_available()) == (env["gpu"] is None)


def test_the_threads_are_read_when_it_is_called():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert environment()["torch_num_threads"] == 1
    finally:
        torch.set_num_threads(before)


def test_cpu_flags_are_the_bf16_ones_of_proc_cpuinfo():
    info = cpu()
    assert set(info["bf16_flags"]) <= set(BF16_FLAGS)
    assert isinstance(info["native_bf16"], bool)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        first = cpuinfo.read_text().split("\n\n")[0]
        flags = next((ln.split(":", 1)[1].split() for ln in first.splitlines() if ln.startswith(("flags", "Features"))),
                     [])
        assert info["bf16_flags"] == [f for f in BF16_FLAGS if f in flags]


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    try:
        _git(tmp_path, "init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not installed")
    _git(tmp_path, "config", "user.email", "t@example.com")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "one")
    return tmp_path


def test_git_revision_marks_uncommitted_changes(repo):
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    git_state.cache_clear()
    (repo / "new.txt").write_text("untracked files do not count\n")
    assert git_state(repo) == (head, False) and git_revision(repo) == head
    git_state.cache_clear()
    (repo / "a.txt").write_text("two\n")
    assert git_state(repo) == (head, True) and git_revision(repo) == head + "+dirty"
    git_state.cache_clear()


def test_git_state_is_read_once_per_process(repo):
    git_state.cache_clear()
    first = git_state(repo)
    (repo / "a.txt").write_text("changed after the start\n")
    assert git_state(repo) == first  # the source the process started from
    git_state.cache_clear()


def test_outside_a_checkout_there_is_no_revision(tmp_path):
    git_state.cache_clear()
    assert git_state(tmp_path) == (None, None) and git_revision(tmp_path) is None
    git_state.cache_clear()
