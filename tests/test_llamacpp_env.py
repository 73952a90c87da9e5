"""benchmarks/_llamacpp_env.py, the environment bench_llamacpp.py runs llama.cpp in, made with every process faked:
a fresh one is built for this CPU, gets llama-cpp-python's own dependencies (it is installed without them), must
import, and is returned as the environment; a ready one is returned without running anything."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _llamacpp_env as llamacpp_env  # noqa: E402


def fake_sdist(root: Path) -> None:
    """The source distribution where ensure() looks first, holding the converter's files and one file it leaves."""
    sdist = root / "sdist" / f"llama_cpp_python-{llamacpp_env.LLAMA_CPP_PYTHON}.tar.gz"
    sdist.parent.mkdir(parents=True)
    with tarfile.open(sdist, "w:gz") as tar:
        for name in ("convert_hf_to_gguf.py", "conversion/__init__.py", "gguf-py/gguf/__init__.py", "README.md"):
            data = f"# {name}\n".encode()
            info = tarfile.TarInfo(llamacpp_env.VENDOR + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


class FakeProcesses:
    """subprocess.run for ensure(): a venv, pip (the build from the sdist, or packages) and the interpreter's
    import checks, which succeed only once llama-cpp-python is built and its dependencies are installed."""

    def __init__(self, install_dependencies: bool = True):
        self.calls, self.built, self.dependencies, self.build_env = [], False, False, None
        self.install_dependencies = install_dependencies

    def __call__(self, cmd, check=False, capture_output=False, text=False, env=None):
        cmd = [str(c) for c in cmd]
        self.calls.append(cmd)
        out = subprocess.CompletedProcess(cmd, 0, "", "")
        if cmd[1:3] == ["-m", "venv"]:
            (Path(cmd[3]) / "bin").mkdir(parents=True)
            (Path(cmd[3]) / "bin" / "python").write_text("")
        elif cmd[1:4] == ["-m", "pip", "install"] and cmd[-1].endswith(".tar.gz"):
            self.built, self.build_env = True, env
        elif cmd[1:4] == ["-m", "pip", "install"]:
            self.dependencies = self.install_dependencies and "diskcache>=5.6.1" in cmd
        elif cmd[1] == "-c":
            works = self.built and self.dependencies
            out.returncode = 0 if works else 1
            out.stdout = llamacpp_env.LLAMA_CPP_PYTHON + "\n" if works and "print" in cmd[2] else ""
            out.stderr = "" if works else "ModuleNotFoundError: No module named 'diskcache'"
        return out


def test_a_fresh_environment_is_built_checked_and_returned(tmp_path, monkeypatch):
    root = tmp_path / "llamacpp"
    fake_sdist(root)
    procs = FakeProcesses()
    monkeypatch.setattr(llamacpp_env.subprocess, "run", procs)
    env = llamacpp_env.ensure(root, log=lambda msg: None)
    assert isinstance(env, llamacpp_env.LlamaCppEnv)
    assert env.python == root / "venv" / "bin" / "python" and env.converter.is_file()
    assert llamacpp_env.BUILD_CFLAGS in procs.build_env["CMAKE_ARGS"]  # built for this CPU, without AMX tiles
    installs = [c for c in procs.calls if c[1:4] == ["-m", "pip", "install"] and not c[-1].endswith(".tar.gz")]
    assert all(p in installs[0] for p in (*llamacpp_env.RUNTIME_PACKAGES, *llamacpp_env.CONVERTER_PACKAGES))
    assert ["-c", "import llama_cpp"] == procs.calls[-1][1:]
    assert not (root / "llama.cpp" / "README.md").exists()  # only the converter's files are taken
    # Ready now: the same call runs nothing.
    procs.calls.clear()
    assert llamacpp_env.ensure(root, log=lambda msg: None) == env and procs.calls == []


def test_an_environment_that_does_not_import_is_not_stamped_ready(tmp_path, monkeypatch):
    root = tmp_path / "llamacpp"
    fake_sdist(root)
    monkeypatch.setattr(llamacpp_env.subprocess, "run", FakeProcesses(install_dependencies=False))
    with pytest.raises(RuntimeError, match="does not import:\nModuleNotFoundError: No module named 'diskcache'"):
        llamacpp_env.ensure(root, log=lambda msg: None)
    assert not list((root / "venv").glob(".linlm-ready-*"))
