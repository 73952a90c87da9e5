"""The compiled kernels' library (linlm.ops.kernel_library): its fallback without a compiler, its build cache, and
the named arguments of its entry points against the C source's signatures."""

from __future__ import annotations

import dataclasses
import re
from ctypes import c_double, c_int64, c_void_p

import pytest
import torch
from test_selective_scan import make_inputs

from linlm.errors import ConfigError
from linlm.ops import (conv_kernel, gate_kernel, gather_sum_kernel, gemv_kernel, kernel_library, scan_kernel,
                       step_kernel)
from linlm.ops.kernel_library import EntryPoint
from linlm.ops.selective_scan import selective_scan, selective_scan_chunked, selective_scan_kernel


def test_no_compiler_falls_back_with_a_warning(monkeypatch, tmp_path):
    """A failing build warns once and leaves the pure-torch scan in charge; nothing half-written stays behind."""
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("LINLM_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("LINLM_SCAN_BACKEND", raising=False)
    kernel_library.library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="pure-torch"):
            assert not kernel_library.available()
        x = make_inputs(T=20, seed=31)
        y, _ = selective_scan(**x)
        torch.testing.assert_close(y, selective_scan_chunked(**x)[0], rtol=0, atol=0)
        assert list(tmp_path.iterdir()) == []
        monkeypatch.setenv("LINLM_SCAN_BACKEND", "kernel")
        with pytest.raises(ConfigError, match="could not be built"):
            selective_scan(**x)
    finally:
        kernel_library.library.cache_clear()


def _c_signatures() -> dict[str, list[tuple[str, bool]]]:
    """Every exported function of the C sources: name -> [(parameter name, is a pointer)], from the source text."""
    return {name: [(n, kind == "pointer") for n, kind in params] for name, params in _c_kinds().items()}


def _c_kinds() -> dict[str, list[tuple[str, str]]]:
    """name -> [(parameter name, "pointer", "int64_t" or "double")], from the source text."""
    text = "\n".join(p.read_text() for p in kernel_library.sources())
    out = {}
    for name, params in re.findall(r"^void SUF\((\w+)\)\(([^;{]*?)\)\s*\{", text, flags=re.M | re.S):
        out[name] = [(re.findall(r"\w+", p)[-1], "pointer" if "*" in p else re.findall(r"\w+", p)[-2])
                     for p in params.split(",")]
    return out


def _entry_points() -> list[type[EntryPoint]]:
    return [cls for module in (scan_kernel, conv_kernel, gate_kernel, gather_sum_kernel, gemv_kernel, step_kernel)
            for cls in vars(module).values()
            if isinstance(cls, type) and issubclass(cls, EntryPoint) and "c_name" in vars(cls)]


def test_every_entry_point_names_the_c_parameters_in_their_order():
    """The named arguments are the C signature's: the same names in the same order, ints where C takes int64_t and
    pointers where it takes a pointer, then (item0, item1); NAME_par takes the scratch row spacing after the scratch
    and (nitems, nthreads) instead. Every C entry point has its class."""
    c = _c_signatures()
    entries = _entry_points()
    assert sorted(e.c_name for e in entries) == sorted(n for n in c if not n.endswith("_par"))
    for e in entries:
        fields = [(f.name, t is c_void_p) for f, t in zip(dataclasses.fields(e), e.argtypes)]
        assert c[e.c_name] == fields + [("item0", False), ("item1", False)], e.__name__
        par = list(fields)
        if e.scratch is not None:
            pos = [n for n, _ in fields].index(e.scratch)
            assert c[e.c_name + "_par"][pos + 1][1] is False  # the spacing of the scratch rows, an int64_t
            par.insert(pos + 1, c[e.c_name + "_par"][pos + 1])
        assert c[e.c_name + "_par"] == par + [("nitems", False), ("nthreads", False)], e.__name__
        assert [p for _, p in c[e.c_name + "_par"]] == [t is c_void_p for t in e.par_argtypes], e.__name__
        ctype = {"pointer": c_void_p, "int64_t": c_int64, "double": c_double}
        assert [ctype[k] for _, k in _c_kinds()[e.c_name]] == e.argtypes, e.__name__


def test_entry_points_take_keywords_only():
    with pytest.raises(TypeError):
        gate_kernel.SiluMulFwd(torch.ones(1, 1), 1, torch.ones(1, 1), 1, torch.ones(1, 1), 1, 1)
    with pytest.raises(TypeError, match="F"):  # a missing argument names itself
        gate_kernel.SiluMulFwd(g=None, gs=1, u=None, us=1, out=None, M=1)


def test_python_constants_equal_the_c_defines():
    """Each kernel's work-item size in Python is its C file's #define (the C file beside the module, or the header
    all of them include)."""
    common = (kernel_library.KERNEL_DIR / "_kernel_common.h").read_text()
    for module, name in ((scan_kernel, "TILE"), (conv_kernel, "CONV_TB"), (gate_kernel, "GATE_ROWS"),
                         (gather_sum_kernel, "GATHER_ROWS"), (gemv_kernel, "GEMV_ROWS"), (gemv_kernel, "Q8_MAX_ROWS"),
                         (step_kernel, "STEP_CH")):
        c_file = kernel_library.KERNEL_DIR / f"_{module.__name__.rsplit('.', 1)[1]}.c"
        assert c_file in kernel_library.sources()
        defines = dict(re.findall(r"^#define (\w+) (\d+)\b", c_file.read_text() + "\n" + common, flags=re.M))
        assert int(defines[name]) == getattr(module, name), (c_file.name, name)


def test_cache_key_changes_with_the_sources_flags_and_compiler(monkeypatch, tmp_path):
    """A change to any C source or header, a new kernel file, other flags or another compiler: another library."""
    for f in kernel_library.KERNEL_DIR.glob("_*"):
        if f.suffix in (".c", ".h"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(kernel_library, "KERNEL_DIR", tmp_path)
    assert [p.name for p in kernel_library.sources()] == [
        "_conv_kernel.c", "_gate_kernel.c", "_gather_sum_kernel.c", "_gemv_kernel.c", "_scan_kernel.c",
        "_step_kernel.c"]
    flags = kernel_library.BASE_FLAGS + kernel_library.tuning_flags()[0]
    keys = {kernel_library.cache_key("cc", flags)}
    assert kernel_library.cache_key("cc", flags) in keys  # the same inputs, the same key
    keys.add(kernel_library.cache_key("gcc", flags))
    keys.add(kernel_library.cache_key("cc", flags + ("-fopenmp",)))
    for name in ("_scan_kernel.c", "_gate_kernel.c", "_kernel_common.h", "_kernel_passes.h"):
        f = tmp_path / name
        f.write_text(f.read_text() + "\n/* one more line */\n")
        keys.add(kernel_library.cache_key("cc", flags))
    (tmp_path / "_new_kernel.c").write_text("/* a new kernel */\n")
    keys.add(kernel_library.cache_key("cc", flags))
    assert len(keys) == 8


@pytest.mark.slow
@pytest.mark.skipif(kernel_library._compiler() is None, reason="no C compiler")
def test_builds_from_an_empty_cache(monkeypatch, tmp_path):
    """An empty cache directory gets one library, named by the cache key (nothing half-written left beside it), and
    the scan runs on it as on the library already cached."""
    x = make_inputs(T=20, seed=32)
    want = selective_scan_kernel(**x)[0] if kernel_library.available() else None
    monkeypatch.setenv("LINLM_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("LINLM_SCAN_BACKEND", raising=False)
    kernel_library.library.cache_clear()
    try:
        assert kernel_library.available()
        built = [p.name for p in tmp_path.iterdir()]
        flags = (kernel_library.BASE_FLAGS + kernel_library.tuning_flags()[0]
                 + (kernel_library.OPENMP_FLAGS[0] if kernel_library.openmp() else kernel_library.OPENMP_FLAGS[1]))
        assert kernel_library.library().flags == flags
        assert built == [f"linlm_kernels_{kernel_library.cache_key(kernel_library._compiler(), flags)}.so"]
        got = selective_scan_kernel(**x)[0]
        torch.testing.assert_close(got, selective_scan_chunked(**x)[0], rtol=1e-9, atol=1e-10)
        if want is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    finally:
        kernel_library.library.cache_clear()


def _picky_compiler(tmp_path, refused: tuple[str, ...]) -> str:
    """A C compiler (a script around the real one) that refuses the given options as an old or a non-x86 compiler
    does: exit 1 with gcc's message, before compiling anything."""
    real = kernel_library._compiler()
    script = tmp_path / "picky-cc"
    cases = "\n".join(f"    {flag}) echo \"cc: error: unrecognized command-line option '{flag}'\" >&2; exit 1;;"
                      for flag in refused)
    script.write_text(f'#!/bin/sh\nfor a in "$@"; do\n  case "$a" in\n{cases}\n  esac\ndone\nexec {real} "$@"\n')
    script.chmod(0o755)
    return str(script)


@pytest.mark.slow
@pytest.mark.skipif(kernel_library._compiler() is None, reason="no C compiler")
@pytest.mark.parametrize("refused", [("-mprefer-vector-width=512",), ("-mprefer-vector-width=512", "-march=native")],
                         ids=["no-512-bit-preference", "no-native-tuning"])
def test_a_compiler_that_refuses_the_tuning_flags_builds_without_them(monkeypatch, tmp_path, caplog, refused):
    """On x86, the kernels ask for -march=native -mprefer-vector-width=512; a compiler that refuses those (clang or
    gcc for another CPU) must still build the kernels, with the next set of flags it takes, say so in one logged
    line, and compute what the torch path computes."""
    import logging

    monkeypatch.setattr(kernel_library.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("CC", _picky_compiler(tmp_path, refused))
    monkeypatch.setenv("LINLM_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LINLM_SCAN_BACKEND", raising=False)
    kernel_library.library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="linlm.ops"):
            assert kernel_library.available()
        lines = [r.getMessage() for r in caplog.records if r.name == "linlm.ops"]
        dropped = " ".join(f for f in ("-march=native", "-mprefer-vector-width=512") if f in refused)
        assert len(lines) == 1 and lines[0].startswith(f"linlm: the C kernels were built without {dropped}, "), lines
        assert "unrecognized command-line option" in lines[0], lines
        assert not set(refused) & set(kernel_library.library().flags)
        x = make_inputs(T=20, seed=33)
        torch.testing.assert_close(selective_scan_kernel(**x)[0], selective_scan_chunked(**x)[0], rtol=1e-9,
                                   atol=1e-10)
        assert all(p.suffix == ".so" and not p.name.startswith(".") for p in (tmp_path / "cache").iterdir())
    finally:
        kernel_library.library.cache_clear()


def test_tuning_flags_ask_for_512_bit_vectors_only_on_x86(monkeypatch):
    monkeypatch.setattr(kernel_library.platform, "machine", lambda: "aarch64")
    assert kernel_library.tuning_flags() == (("-march=native",), ())
    monkeypatch.setattr(kernel_library.platform, "machine", lambda: "x86_64")
    assert kernel_library.tuning_flags()[0] == ("-march=native", "-mprefer-vector-width=512")
    assert kernel_library.tuning_flags()[-1] == ()
