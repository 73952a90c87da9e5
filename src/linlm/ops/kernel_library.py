"""The compiled CPU kernels' shared library: how it is built from the C sources, cached and loaded, which backend is
asked for, and how a call's named arguments reach a C entry point. No op lives here: each kernel's module
(scan_kernel, conv_kernel, gate_kernel, gather_sum_kernel) declares its entry points' arguments with
``entry_point`` and wraps them for autograd, and kernel_threads runs them over threads.

Build: every ``_*_kernel.c`` beside this module (each kernel's C beside its Python module, sharing the headers
``_kernel_*.h``) is compiled into one library: plain C, no Python or torch headers, compiled on first use with the
system's C compiler (``$CC``, else ``cc`` or ``gcc``), once per sources, flags, compiler and CPU. The library is
cached under ``$LINLM_KERNEL_CACHE`` (default: the user cache dir, ``.../linlm/kernels``), named by a hash of the
sources and headers, the flags, the compiler and the CPU's feature flags; it is written to a temporary name and
renamed, so concurrent processes never load a half-written file.

Flags: the portable ``BASE_FLAGS``, then the first set of ``tuning_flags()`` the compiler accepts for this CPU:
``-march=native`` everywhere, with ``-mprefer-vector-width=512`` first on x86 (where AVX-512 exists, 512-bit
vectors are used; on an AVX2 CPU the option changes nothing). A compiler that refuses a set (an old or another
compiler, another architecture) gets the next one, down to none, and one logged line says which flags were
dropped; the kernels compute the same either way. It is built with ``-fopenmp`` where the compiler has it (the
NAME_par entry points, see kernel_threads), else without. Without a compiler, or if every build fails (a warning
says why), ``available()`` is False and every op takes its pure-torch form. ``LINLM_SCAN_BACKEND=torch`` forces
those forms; ``=kernel`` makes a missing kernel an error. ``library().flags`` are the flags it was built with.

Dtypes: each kernel has a float32, a float64 and a bfloat16 variant (NAME_f32, NAME_f64, NAME_bf16; see
``_kernel_common.h``). The bfloat16 one reads and writes bfloat16 activations in place and does its arithmetic and
accumulation in float32, rounding each result once to nearest, as torch's .to(torch.bfloat16) does: under bf16
autocast the scan's u and y, the conv, the gate and the read-back's rows stay bfloat16, with no conversion to
float32 and back around each call (the same values as that conversion for the scan and the conv; one rounding
instead of two for the gate). What stays float32 either way: dt, A, B, C, D and the states of the scan, the conv's
weights, the read-back's weights, and every gradient of those.

Named arguments: an entry point's arguments are a keyword-only dataclass whose fields are the C function's
parameters, in the C order and with the C names (the order is written there, next to the C signature, and nowhere
else; tests/ops/test_kernel_library.py checks each against the C sources). A Tensor field (None: NULL) is passed as a
pointer to its data, an int field as an int64_t, a float field as a double; the range of work items (item0, item1)
that every entry point takes last is added by the runner.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import operator
import os
import platform
import shutil
import subprocess
import tempfile
import logging
import sys
import typing
import warnings
from ctypes import CDLL, c_double, c_int64, c_void_p
from pathlib import Path

from linlm.errors import ConfigError

log = logging.getLogger("linlm.ops")

__all__ = [
    "IO_DTYPES", "EntryPoint", "available", "backend", "compute_dtype", "entry_point", "function", "library",
    "openmp",
]

KERNEL_DIR = Path(__file__).parent
BASE_FLAGS = ("-O3", "-fPIC", "-shared", "-std=gnu11")
X86 = ("x86_64", "amd64", "i386", "i686")
# -fopenmp adds the entry points that run in torch's OpenMP pool (NAME_par); a compiler without OpenMP gets the
# second set, and the work items then go to Python threads.
OPENMP_FLAGS = (("-fopenmp",), ("-fopenmp-simd",))
BACKENDS = ("auto", "torch", "kernel")
# The library's variant per activation dtype, by the dtype's name (see the C file's header): bfloat16 activations
# with float32 arithmetic. Keyed by name so that this module imports no torch: a process without it (linlm.infer.lean)
# loads the library too, and names the variant by its suffix.
_SUFFIX = {"torch.float32": "f32", "torch.float64": "f64", "torch.bfloat16": "bf16"}


def __getattr__(name: str):
    if name == "IO_DTYPES":  # the torch dtypes the kernels read and write, made on first use
        import torch

        return tuple(getattr(torch, key.split(".")[1]) for key in _SUFFIX)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tuning_flags() -> tuple[tuple[str, ...], ...]:
    """The sets of CPU-tuning flags to try, best first; the last one is empty (always accepted)."""
    if platform.machine().lower() in X86:
        return ("-march=native", "-mprefer-vector-width=512"), ("-march=native",), ()
    return ("-march=native",), ()


def backend() -> str:
    """The kernel backend asked for by $LINLM_SCAN_BACKEND: auto (default), torch or kernel."""
    name = os.environ.get("LINLM_SCAN_BACKEND", "auto").strip().lower() or "auto"
    if name not in BACKENDS:
        raise ConfigError(
            f"LINLM_SCAN_BACKEND={name!r} is not a scan backend; use one of {', '.join(BACKENDS)}"
        )
    return name


def compute_dtype(io):
    """The torch dtype the kernels compute and accumulate in for activations of dtype ``io``: float64 for float64,
    else float32 (bfloat16 activations are widened as they are read and rounded to nearest as they are written)."""
    import torch

    return torch.float64 if io == torch.float64 else torch.float32


# ---------------------------------------------------------------------------------------------------------------------
# build and cache


def _cache_dir() -> Path:
    env = os.environ.get("LINLM_KERNEL_CACHE")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("linlm")) / "kernels"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def sources() -> list[Path]:
    """The C files the library is compiled from: every kernel's ``_*_kernel.c`` in KERNEL_DIR."""
    return sorted(KERNEL_DIR.glob("_*_kernel.c"))


def cache_key(cc: str, flags: tuple[str, ...]) -> str:
    """The name of the library built from the current sources and headers with compiler ``cc`` and ``flags`` on
    this CPU: a hash of all of them, so that a change to any of them builds afresh."""
    files = [*sources(), *sorted(KERNEL_DIR.glob("_kernel_*.h"))]
    parts = [p for f in files for p in (f.name.encode(), f.read_bytes())]
    parts += [" ".join(flags).encode(), cc.encode(), _cpu_flags().encode(), platform.machine().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _build(cc: str, flags: tuple[str, ...]) -> Path:
    """Compile the sources once per (sources, flags, compiler, CPU); return the library's path."""
    out_dir = _cache_dir()
    path = out_dir / f"linlm_kernels_{cache_key(cc, flags)}.so"
    if path.exists():
        return path
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".linlm_kernels_", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *flags, "-o", tmp, *map(str, sources())], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


class _Library(typing.NamedTuple):
    cdll: CDLL
    openmp: bool  # built with -fopenmp: it has the NAME_par entry points
    functions: dict  # (entry point class, dtype, parallel) -> its C function, argtypes set
    flags: tuple[str, ...]  # the compiler flags it was built with


@functools.lru_cache(maxsize=None)
def library() -> _Library | None:
    """The loaded library, built first if need be; None (with a warning) when it cannot be built."""
    cc = _compiler()
    if cc is None:
        return None
    errors = []
    tunings = tuning_flags()
    for tuning in tunings:
        for extra in OPENMP_FLAGS:
            flags = BASE_FLAGS + tuning + extra
            try:
                lib = _Library(CDLL(str(_build(cc, flags))), extra == OPENMP_FLAGS[0], {}, flags)
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                errors.append(e)
                continue
            if tuning != tunings[0]:
                dropped = " ".join(f for f in tunings[0] if f not in tuning)
                log.warning("linlm: the C kernels were built without %s, which %s refused (%s)", dropped, cc,
                            _first_line(errors[0]))
            return lib
    warnings.warn(f"linlm: the selective-scan kernel could not be built ({errors[-1]}); using the pure-torch "
                  "scan", RuntimeWarning, stacklevel=3)
    return None


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    error_lines = [line for line in lines if "error" in line.lower()]
    return (error_lines or lines or ["no message"])[-1][:300]


def available() -> bool:
    """True when the ops should run on the compiled kernels (built now if need be). False while torch.export or
    torch.compile traces: the kernels are opaque to them, and the graph takes the pure-torch paths (same math)."""
    torch = sys.modules.get("torch")  # a process without torch traces nothing
    if torch is not None and (torch.compiler.is_exporting() or torch.compiler.is_compiling()):
        return False
    if "LINLM_SCAN_BACKEND" not in os.environ:  # auto: the common case, on every kernel call, kept cheap
        return library() is not None
    name = backend()
    if name == "torch":
        return False
    ok = library() is not None
    if not ok and name == "kernel":
        raise ConfigError(
            "LINLM_SCAN_BACKEND=kernel but the selective-scan kernel could not be built (no C compiler on PATH, "
            "or the build failed: see the warning); install gcc or unset LINLM_SCAN_BACKEND"
        )
    return ok


def openmp() -> bool:
    """Whether the kernels are available and the library was built with OpenMP (it has the NAME_par entry points)."""
    return available() and library().openmp


# ---------------------------------------------------------------------------------------------------------------------
# named arguments of the entry points


class EntryPoint:
    """Base of the classes that ``entry_point`` makes, the named arguments of one C entry point (and of the plain
    dataclasses of leading fields that two entry points share, such as scan_kernel.ScanInputs)."""

    __slots__ = ()

    c_name: typing.ClassVar[str]  # the C function, without its dtype suffix
    scratch: typing.ClassVar[str | None]  # the field that holds per-thread scratch rows [threads, size], or None
    _fields: typing.ClassVar[tuple[str, ...]]
    _values: typing.ClassVar[typing.Callable]  # the fields' values, in order
    _pointers: typing.ClassVar[tuple[int, ...]]  # the positions of the pointer fields
    argtypes: typing.ClassVar[list]  # NAME's, item0 and item1 included
    par_argtypes: typing.ClassVar[list]  # NAME_par's: the scratch row spacing after the scratch, nitems, nthreads

    def c_args(self, thread: int = 0) -> list:
        """The values NAME takes, without the item range; the scratch field gives its row ``thread``."""
        out = list(self._values(self))
        for i in self._pointers:
            if out[i] is not None:
                out[i] = address(out[i])
        if thread and self.scratch is not None:
            out[self._fields.index(self.scratch)] = address(getattr(self, self.scratch)[thread])
        return out

    def par_args(self) -> list:
        """The values NAME_par takes, without nitems and nthreads: the scratch field gives its first row's pointer
        followed by the spacing of its rows."""
        out = self.c_args()
        if self.scratch is not None:
            pos = self._fields.index(self.scratch)
            rows = getattr(self, self.scratch)
            out.insert(pos + 1, rows.stride(0) if hasattr(rows, "stride") else rows.strides[0] // rows.itemsize)
        return out


def address(buffer) -> int:
    """The address of a torch tensor's data, or of a numpy array's (a process without torch passes those)."""
    try:
        return buffer.data_ptr()
    except AttributeError:
        return buffer.ctypes.data


_T = typing.TypeVar("_T")


def entry_point(c_name: str, *, scratch: str | None = None) -> typing.Callable[[type[_T]], type[_T]]:
    """Class decorator: the class's annotated fields are the parameters of C function ``c_name`` (each dtype's
    variant, NAME_f32 and so on), in its order and with its names; ``int`` fields are int64_t, ``float`` fields
    double, every other field a pointer (a Tensor, or None for NULL). ``scratch`` names the field of per-thread
    scratch rows. The class becomes a keyword-only dataclass, so that every call site names each tensor and size."""

    def wrap(cls):
        cls = dataclasses.dataclass(kw_only=True, slots=True)(cls)
        # the annotations as written (names, not evaluated: a pointer field may be a Tensor or a numpy array)
        hints = {k: getattr(v, "__name__", v) for base in reversed(cls.__mro__)
                 for k, v in vars(base).get("__annotations__", {}).items()}
        names = tuple(f.name for f in dataclasses.fields(cls))
        types = [c_int64 if hints[name] in ("int", "bool") else c_double if hints[name] == "float" else c_void_p
                 for name in names]
        if scratch is not None and scratch not in names:
            raise TypeError(f"{cls.__name__}: the scratch field {scratch!r} is not one of its fields")
        cls.c_name, cls.scratch, cls._fields, cls._values = c_name, scratch, names, operator.attrgetter(*names)
        cls._pointers = tuple(i for i, t in enumerate(types) if t is c_void_p)
        cls.argtypes = types + [c_int64, c_int64]
        pos = None if scratch is None else names.index(scratch)
        cls.par_argtypes = (types if pos is None else types[: pos + 1] + [c_int64] + types[pos + 1:]) + [c_int64] * 2
        return cls

    return wrap


def function(entry: type[EntryPoint], dtype, parallel: bool = False):
    """The library's C function for ``entry`` on activations of ``dtype`` (torch's float32, float64 or bfloat16, or
    the variant's suffix: "f32", "f64", "bf16"), its argtypes set: NAME_SUFFIX, or NAME_par_SUFFIX with ``parallel``
    (None when the library has no OpenMP)."""
    lib = library()
    key = (entry, dtype, parallel)
    fn = lib.functions.get(key)
    if fn is None:
        if parallel and not lib.openmp:
            return None
        name = f"{entry.c_name}_par" if parallel else entry.c_name
        fn = getattr(lib.cdll, f"{name}_{dtype if isinstance(dtype, str) else _SUFFIX[str(dtype)]}")
        fn.argtypes = entry.par_argtypes if parallel else entry.argtypes
        lib.functions[key] = fn
    return fn
