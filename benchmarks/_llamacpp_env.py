"""llama.cpp for benchmarks/bench_llamacpp.py: llama-cpp-python in an environment of its own, made on demand.

Nothing in linlm or its tests needs llama.cpp. The benchmark makes, once, a virtual environment under the user cache
(``$LINLM_LLAMACPP_DIR``, default ``<user cache>/linlm/llamacpp``) holding:

- llama-cpp-python, built from its PyPI source distribution (pinned below) for this CPU: llama.cpp's own build,
  with its default flags (``GGML_NATIVE``: the instructions of the machine that builds it) less the AMX tile
  instructions (``BUILD_CFLAGS``). On an Intel Xeon with AMX (family 6, model 207, in a VM that grants the AMX
  state) the native build's Q8_0 matrix product stops at its first ``tilezero`` with an illegal instruction, in
  every thread count; without AMX, llama.cpp's Q8_0 runs its AVX-512 VNNI kernels, the instructions linlm's int8
  GEMM (fbgemm) uses too. On a CPU without AMX the flags change nothing. On two cores the build takes about ten
  minutes; later runs find it there.
- llama-cpp-python's runtime dependencies (diskcache, jinja2, typing-extensions: it is installed without its
  dependencies, so that its build pulls nothing else); a made environment must import ``llama_cpp``.
- What llama.cpp's converter needs: torch (the CPU build linlm pins), numpy, sentencepiece, transformers (the
  version its requirements pin), and ``gguf`` from PyPI (the converter itself imports the copy of gguf-py that ships
  beside it, as it does in llama.cpp's tree).
- llama.cpp's converter, ``convert_hf_to_gguf.py`` with its ``conversion/`` package and ``gguf-py/``, taken from
  the same source distribution (``vendor/llama.cpp``), so that converter and engine are one revision.

A ready environment carries a stamp file naming the pinned packages; a missing or different stamp means it is made
again (llama-cpp-python is rebuilt only when its version differs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
TORCH = "torch==2.13.0"
# llama-cpp-python's own dependencies (it is built with --no-deps: the build must not pull another numpy), then the
# converter's packages; gguf-py ships beside it, gguf from PyPI brings the same dependencies.
RUNTIME_PACKAGES = ("diskcache>=5.6.1", "jinja2>=2.11.3", "typing-extensions>=4.5.0")
CONVERTER_PACKAGES = ("gguf", "sentencepiece", "numpy", "transformers==4.57.6", TORCH)
# Appended to the native flags: an explicit -mno-* wins over -march=native in GCC and Clang.
BUILD_CFLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
VENDOR = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
CONVERTER_FILES = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


@dataclass(frozen=True)
class LlamaCppEnv:
    python: Path      # the environment's interpreter (imports llama_cpp, sentencepiece, torch)
    converter: Path   # convert_hf_to_gguf.py
    version: str


def default_root() -> Path:
    env = os.environ.get("LINLM_LLAMACPP_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("linlm")) / "llamacpp"


def _run(cmd: list, log) -> None:
    log("$ " + " ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True)


def ensure(root: Path | None = None, log=print) -> LlamaCppEnv:
    """The environment under ``root``, made first if it is not ready (downloads and builds: minutes)."""
    root = Path(root) if root is not None else default_root()
    venv, tree = root / "venv", root / "llama.cpp"
    python = venv / "bin" / "python"
    stamp = venv / f".linlm-ready-{LLAMA_CPP_PYTHON}"
    env = LlamaCppEnv(python, tree / "convert_hf_to_gguf.py", LLAMA_CPP_PYTHON)
    wanted = "\n".join([LLAMA_CPP_PYTHON, BUILD_CFLAGS, *RUNTIME_PACKAGES, *CONVERTER_PACKAGES]) + "\n"
    if stamp.is_file() and stamp.read_text() == wanted and env.converter.is_file():
        return env
    root.mkdir(parents=True, exist_ok=True)
    sdist_dir = root / "sdist"
    sdist = sdist_dir / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not sdist.is_file():
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", sdist_dir,
              f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], log)
    if not python.is_file():
        _run([sys.executable, "-m", "venv", venv], log)
    have = subprocess.run([python, "-c", "import llama_cpp; print(llama_cpp.__version__)"], capture_output=True,
                          text=True).stdout.strip()
    built_flags = venv / ".linlm-build-flags"
    if have != LLAMA_CPP_PYTHON or not built_flags.is_file() or built_flags.read_text() != BUILD_CFLAGS:
        log(f"building llama-cpp-python {LLAMA_CPP_PYTHON} from source for this CPU (minutes on two cores)")
        flags = f"-DCMAKE_C_FLAGS='{BUILD_CFLAGS}' -DCMAKE_CXX_FLAGS='{BUILD_CFLAGS}'"
        build_env = {**os.environ, "CMAKE_ARGS": (os.environ.get("CMAKE_ARGS", "") + " " + flags).strip()}
        log(f"  CMAKE_ARGS={build_env['CMAKE_ARGS']}")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", "--no-cache-dir",
                        str(sdist)], check=True, env=build_env)
        built_flags.write_text(BUILD_CFLAGS)
    _run([python, "-m", "pip", "install", "-q", *RUNTIME_PACKAGES, *CONVERTER_PACKAGES], log)
    check = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError(f"llama-cpp-python in {venv} does not import:\n{check.stderr[-2000:]}")
    tmp = root / "llama.cpp.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(VENDOR) and m.name[len(VENDOR):].startswith(CONVERTER_FILES)]
        for m in members:
            m.name = m.name[len(VENDOR):]
        tar.extractall(tmp, members=members, filter="data")
    shutil.rmtree(tree, ignore_errors=True)
    tmp.rename(tree)
    stamp.write_text(wanted)
    return env
