"""The S6 selective scan, Mamba's short causal conv + SiLU, and the gated SiLU silu(g) * u (Mamba's output gate,
SwiGLU's activation), as compiled CPU kernels (``_scan_kernel.c``), loaded through ctypes.

Why a kernel: the scan is a few multiply-adds per state element and step, so any form built from tensor ops is
bound by its passes over a [Bt, T, Din, N] working set (the chunked form makes about a dozen). The kernel keeps a
tile of 64 channels' states (N x 64 values) in L1 and makes one pass over the inputs forward, and in the backward
one recomputation and one adjoint pass per segment of 64 steps, from states checkpointed every 64 steps in the
forward (Bt x T/64 x Din x N values, what the chunked form keeps too). A tile's consecutive steps are Din values
apart (a new page per step at Din = 1024, where the hardware prefetchers stop), so both passes prefetch the rows a
few steps ahead. See the C file's header for the layout.

The conv and the gate are memory-bound passes that torch would make as several ops (the gate: silu, mul, and three
more ops backward, saving silu(g) besides its inputs); each kernel makes one pass each way and saves only its
inputs. ``LINLM_SCAN_BACKEND`` switches all three.

Dtypes: each kernel has a float32, a float64 and a bfloat16 variant (NAME_f32, NAME_f64, NAME_bf16). The bfloat16
one reads and writes bfloat16 activations in place and does its arithmetic and accumulation in float32, rounding each
result once to nearest, as torch's .to(torch.bfloat16) does: under bf16 autocast the scan's u and y, the conv, the
gate and the read-back's rows stay bfloat16, with no conversion to float32 and back around each call (the same
values as that conversion for the scan and the conv; one rounding instead of two for the gate). What stays float32
either way: dt, A, B, C, D and the states of the scan, the conv's weights, the read-back's weights, and every
gradient of those.

Build: plain C, no Python or torch headers, compiled on first use with the system's C compiler (``$CC``, else
``cc`` or ``gcc``): about 20 s of CPU with gcc 12 for the three variants, once per source, flags and CPU. The
library is cached under ``$LINLM_KERNEL_CACHE`` (default: the user cache dir, ``.../linlm/kernels``), named by a
hash of the source, the flags, the compiler and the CPU's feature flags (it is built with ``-march=native``); it is
written to a temporary name and renamed, so concurrent processes never load a half-written file. Without a
compiler, or if the build fails (a warning says why), ``available()`` is False and
``linlm.ops.selective_scan.selective_scan`` uses the pure-torch chunked form. ``LINLM_SCAN_BACKEND=torch`` forces
that form; ``=kernel`` makes a missing kernel an error.

Threads: the (batch row, channel tile) work items are split over ``torch.get_num_threads()`` threads. Built with
``-fopenmp`` (gcc, clang with libomp), the library's NAME_par entry points run them in torch's own OpenMP pool (the
process loads one libgomp, torch's): after each of torch's parallel ops the pool's worker spins for some
milliseconds, and a kernel on threads of its own then shared the two cores with that spinning thread (a scan right
after a matmul took 19-22 ms instead of 14 at 2 threads; a Mamba step at paper-70m, seq 2048, 1.12x faster in the
pool). Built without OpenMP, the items go to Python threads (ctypes releases the GIL).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from linlm.errors import ConfigError
from linlm.ops.grad import needs_grad

__all__ = [
    "available", "backend", "compute_dtype", "conv_silu", "gate_takes", "gather_sum_takes", "glu_silu",
    "kernel_scan", "openmp_pool", "own_threads", "silu_mul", "weighted_gather_sum",
]

SOURCE = Path(__file__).with_name("_scan_kernel.c")
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fPIC", "-shared", "-std=gnu11")
# -fopenmp adds the entry points that run in torch's OpenMP pool (NAME_par); a compiler without OpenMP gets the
# second set, and the work items then go to Python threads.
OPENMP_FLAGS = (("-fopenmp",), ("-fopenmp-simd",))
TILE = 64  # channels per work item; must equal TILE in the C source
CKPT = 64  # steps between saved states (the backward's segment length)
MAX_STATE = 64  # largest d_state the kernel takes: its per-item arrays (6 x N x TILE values) live on the stack
BACKENDS = ("auto", "torch", "kernel")


def backend() -> str:
    """The scan backend asked for by $LINLM_SCAN_BACKEND: auto (default), torch or kernel."""
    name = os.environ.get("LINLM_SCAN_BACKEND", "auto").strip().lower() or "auto"
    if name not in BACKENDS:
        raise ConfigError(
            f"LINLM_SCAN_BACKEND={name!r} is not a scan backend; use one of {', '.join(BACKENDS)}"
        )
    return name


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


def _build(cc: str, flags: tuple[str, ...]) -> Path:
    """Compile the source once per (source, flags, compiler, CPU); return the library's path."""
    src = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([src, " ".join(flags).encode(), cc.encode(), _cpu_flags().encode(),
                                     platform.machine().encode()])).hexdigest()[:16]
    out_dir = _cache_dir()
    path = out_dir / f"scan_kernel_{key}.so"
    if path.exists():
        return path
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".scan_kernel_", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


_P, _I = ctypes.c_void_p, ctypes.c_int64
# Each kernel's arguments (the last two: the range of work items item0, item1), and the position of its per-thread
# scratch pointer (None: none). NAME_par takes the same without the range, the scratch spacing after the scratch
# pointer, then the number of items and of threads.
_ARGTYPES = {
    "scan_fwd": [_P, _P, _P, _I, _P, _P, _P, _I, _P, _P, _P, _P, _P, _P] + [_I] * 8,
    "scan_bwd": [_P, _P, _P, _I, _P, _P, _P, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P] + [_I] * 8,
    "conv_fwd": [_P] * 6 + [_I] * 7,
    "conv_bwd": [_P] * 11 + [_I] * 7,
    "silu_mul_fwd": [_P, _I, _P, _I, _P] + [_I] * 4,
    "silu_mul_bwd": [_P, _P, _I, _P, _I, _P, _I, _P] + [_I] * 5,
    "gather_sum_fwd": [_P] * 4 + [_I] * 5,
    "gather_sum_bwd": [_P] * 6 + [_I] * 5,
}
# The library's variant per activation dtype (see the C file's header): bfloat16 activations with float32 arithmetic.
_SUFFIX = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16"}
IO_DTYPES = tuple(_SUFFIX)


def compute_dtype(io: torch.dtype) -> torch.dtype:
    """The dtype the kernels compute and accumulate in for activations of dtype ``io``: float64 for float64, else
    float32 (bfloat16 activations are widened as they are read and rounded to nearest as they are written)."""
    return torch.float64 if io == torch.float64 else torch.float32


_SCRATCH = {"scan_fwd": None, "scan_bwd": 20, "conv_fwd": None, "conv_bwd": 6, "silu_mul_fwd": None,
            "silu_mul_bwd": None, "gather_sum_fwd": None, "gather_sum_bwd": None}


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL | None:
    cc = _compiler()
    if cc is None:
        return None
    errors = []
    for extra in OPENMP_FLAGS:
        try:
            lib = ctypes.CDLL(str(_build(cc, FLAGS + extra)))
            break
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            errors.append(e)
    else:
        warnings.warn(f"linlm: the selective-scan kernel could not be built ({errors[-1]}); using the pure-torch "
                      "scan", RuntimeWarning, stacklevel=3)
        return None
    for suf in _SUFFIX.values():
        for name, types in _ARGTYPES.items():
            getattr(lib, f"{name}_{suf}").argtypes = types
            par = getattr(lib, f"{name}_par_{suf}", None)  # absent without OpenMP
            if par is not None:
                pos = _SCRATCH[name]
                head = types[:-2] if pos is None else types[: pos + 1] + [_I] + types[pos + 1 : -2]
                par.argtypes = head + [_I, _I]
    return lib


def available() -> bool:
    """True when the scan should run on the compiled kernel (built now if need be). False while torch.export
    traces: the kernel is opaque to it, and the exported graph takes the pure-torch path (same math)."""
    name = backend()
    if name == "torch" or torch.compiler.is_exporting():
        return False
    ok = _library() is not None
    if not ok and name == "kernel":
        raise ConfigError(
            "LINLM_SCAN_BACKEND=kernel but the selective-scan kernel could not be built (no C compiler on PATH, "
            "or the build failed: see the warning); install gcc or unset LINLM_SCAN_BACKEND"
        )
    return ok


# ---------------------------------------------------------------------------------------------------------------------
# running the work items on threads

_use_pool = True  # False inside own_threads()
_pool: tuple[int, int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _executor(n: int) -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid() or _pool[1] != n:  # a forked child needs threads of its own
            _pool = (os.getpid(), n, ThreadPoolExecutor(max_workers=n, thread_name_prefix="linlm-scan"))
        return _pool[2]


def openmp_pool() -> bool:
    """Whether the kernels split their work items in torch's OpenMP pool: the library was built with OpenMP (it has
    the NAME_par entry points) and no own_threads() block is active."""
    return _use_pool and available() and hasattr(_library(), "scan_fwd_par_f32")


@contextlib.contextmanager
def own_threads():
    """Within the block the kernels split their work items over Python threads of their own, as a build without
    OpenMP does, even where the library has the OpenMP entry points: to compare the two runners
    (benchmarks/bench_kernel_threads.py) and to test both. Not thread-safe: one switch for the process."""
    global _use_pool
    was, _use_pool = _use_pool, False
    try:
        yield
    finally:
        _use_pool = was


def _workers(n_items: int) -> int:
    """Threads that n_items work items run on (_run), and so the per-thread scratch buffers a call needs."""
    return max(1, min(torch.get_num_threads(), n_items))


def _run(name: str, dtype: torch.dtype, n_items: int, args: tuple, scratch: Tensor | None = None) -> None:
    """Run kernel ``name`` (its variant for activations of ``dtype``: float32, float64 or bfloat16) over n_items
    work items: in torch's OpenMP
    pool where the library has the NAME_par entry points (outside own_threads()), else over contiguous ranges of
    the items on Python threads (ctypes releases the GIL). ``args``: the kernel's arguments without the item range;
    a kernel with per-thread scratch (_SCRATCH) gets row i of ``scratch`` [threads, size] for thread i (args holds
    row 0's pointer there)."""
    lib = _library()
    suf = _SUFFIX[dtype]
    n = _workers(n_items)
    pos = _SCRATCH[name]
    par = getattr(lib, f"{name}_par_{suf}", None) if n > 1 and _use_pool else None
    if par is not None:
        par(*(args if pos is None else (*args[: pos + 1], scratch.stride(0), *args[pos + 1 :])), n_items, n)
        return
    fn = getattr(lib, f"{name}_{suf}")
    if n == 1:
        fn(*args, 0, n_items)
        return

    def worker_args(i):
        return args if pos is None else (*args[:pos], scratch[i].data_ptr(), *args[pos + 1 :])

    bounds = [n_items * i // n for i in range(n + 1)]
    futures = [_executor(n).submit(fn, *worker_args(i), bounds[i], bounds[i + 1]) for i in range(n)]
    for f in futures:
        f.result()


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class _KernelScan(torch.autograd.Function):
    """y (with the D skip) and the final state. Inputs contiguous on the CPU: u (so y and du) float32, float64 or
    bfloat16, everything else in its compute dtype (compute_dtype). With dt_sp, dt is the pre-activation and the
    kernel applies softplus (its gradient is then the pre-activation's)."""

    @staticmethod
    def forward(ctx, u, dt, A, B, C, D, init, reset, lengths, dt_sp):
        ctx.set_materialize_grads(False)
        Bt, T, Din = u.shape
        N = A.shape[-1]
        nseg = -(-T // CKPT)
        ckpt = dt.new_empty(Bt, nseg, Din, N) if any(ctx.needs_input_grad[:7]) else None
        y = u.new_empty(Bt, T, Din)
        final = dt.new_empty(Bt, Din, N)
        reset_b = None if reset is None else reset.contiguous().view(torch.uint8)
        args = (_ptr(u), _ptr(dt), _ptr(A), _bstride(A, 3), _ptr(B), _ptr(C), _ptr(D), _bstride(D, 2), _ptr(init),
                _ptr(reset_b), _ptr(lengths), _ptr(y), _ptr(final), _ptr(ckpt), int(dt_sp), Bt, T, Din, N, CKPT)
        _run("scan_fwd", u.dtype, Bt * -(-Din // TILE), args)
        if ckpt is not None:
            ctx.save_for_backward(u, dt, A, B, C, D, reset_b, lengths, ckpt)
            ctx.dt_sp = bool(dt_sp)
        return y, final

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dfinal):
        u, dt, A, B, C, D, reset_b, lengths, ckpt = ctx.saved_tensors
        Bt, T, Din = u.shape
        N = A.shape[-1]
        ntiles = -(-Din // TILE)
        dy = u.new_zeros(Bt, T, Din) if dy is None else dy.to(u.dtype).contiguous()
        dfinal = None if dfinal is None else dfinal.to(dt.dtype).contiguous()
        du, ddt = torch.empty_like(u), torch.empty_like(dt)
        dA_rows, dD_rows = dt.new_empty(Bt, Din, N), dt.new_empty(Bt, Din)
        dB_parts, dC_parts = dt.new_empty(ntiles, Bt, T, N), dt.new_empty(ntiles, Bt, T, N)
        dinit = dt.new_empty(Bt, Din, N)
        n_items = Bt * ntiles
        work = dt.new_empty(_workers(n_items), (2 * N + 2) * CKPT * TILE)
        args = (_ptr(u), _ptr(dt), _ptr(A), _bstride(A, 3), _ptr(B), _ptr(C), _ptr(D), _bstride(D, 2), _ptr(reset_b),
                _ptr(lengths), _ptr(ckpt), _ptr(dy), _ptr(dfinal), _ptr(du), _ptr(ddt), _ptr(dA_rows),
                _ptr(dB_parts), _ptr(dC_parts), _ptr(dD_rows), _ptr(dinit))
        _run("scan_bwd", u.dtype, n_items, (*args, work.data_ptr(), int(ctx.dt_sp), Bt, T, Din, N, CKPT), work)
        dA = dA_rows if A.dim() == 3 else dA_rows.sum(0)
        dD = None if D is None else (dD_rows if D.dim() == 2 else dD_rows.sum(0))
        dB = dB_parts[0] if ntiles == 1 else dB_parts.sum(0)
        dC = dC_parts[0] if ntiles == 1 else dC_parts.sum(0)
        grads = (du, ddt, dA, dB, dC, dD, dinit)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:7])), None, None, None)


def _bstride(t: Tensor | None, batched_dim: int) -> int:
    """Elements between batch rows: A batched is [Bt, Din, N] (dim 3), D batched is [Bt, Din] (dim 2); 0 when shared."""
    return t[0].numel() if t is not None and t.dim() == batched_dim else 0


def kernel_scan(u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, init: Tensor | None,
                reset: Tensor | None, lengths: Tensor | None = None,
                dt_softplus: bool = False) -> tuple[Tensor, Tensor]:
    """(y = scan + D u, final state). u and y in u's dtype (float32, float64 or bfloat16: the kernel reads and
    writes bfloat16 in place, computing in float32), the state and every other input in compute_dtype(u.dtype).
    Arguments already checked.

    dt_softplus: dt is the pre-activation and the step size is softplus(dt), computed in the kernel (no separate pass
    over dt, forward or backward).

    lengths: None or int64 [Bt]: row b is steps 0 .. lengths[b] - 1; later steps are padding, where y = D u, the state
    stays as it is and no gradient reaches dt, B, C (nor u beyond D's term).
    """
    cd = compute_dtype(u.dtype)
    u = u.contiguous()
    dt, A, B, C = (t.to(cd).contiguous() for t in (dt, A, B, C))
    D, init = (None if t is None else t.to(cd).contiguous() for t in (D, init))
    if lengths is not None:
        lengths = lengths.to(torch.int64).clamp(0, u.shape[1]).contiguous()
    return _KernelScan.apply(u, dt, A, B, C, D, init, reset, lengths, dt_softplus)


CONV_TB = 128  # time steps per work item of the conv; must equal CONV_TB in the C source


class _ConvSiLU(torch.autograd.Function):
    """silu(causal depthwise conv1d(x) + bias), the backward recomputing the pre-activation (nothing else saved)."""

    @staticmethod
    def forward(ctx, x, state, wt, bias, since):
        Bt, T, C = x.shape
        K = wt.shape[0]
        out = x.new_empty(Bt, T, C)
        args = (_ptr(x), _ptr(state), _ptr(wt), _ptr(bias), _ptr(since), _ptr(out), Bt, T, C, K, x.stride(1))
        _run("conv_fwd", x.dtype, Bt * -(-T // CONV_TB), args)
        ctx.save_for_backward(x, state, wt, bias, since)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, state, wt, bias, since = ctx.saved_tensors
        Bt, T, C = x.shape
        K = wt.shape[0]
        n_items = Bt * -(-T // CONV_TB)
        dy = dy.to(x.dtype).contiguous()
        dx = x.new_empty(Bt, T, C)
        dstate = None if state is None or not ctx.needs_input_grad[1] else torch.empty_like(state)
        dw, dbias = wt.new_empty(n_items, K, C), wt.new_empty(n_items, C)
        ring = wt.new_empty(_workers(n_items), K * C)  # one per thread
        args = (_ptr(dy), _ptr(x), _ptr(state), _ptr(wt), _ptr(bias), _ptr(since))
        rest = (_ptr(dx), _ptr(dstate), _ptr(dw), _ptr(dbias), Bt, T, C, K, x.stride(1))
        _run("conv_bwd", x.dtype, n_items, (*args, ring.data_ptr(), *rest), ring)
        return dx, dstate, dw.sum(0), dbias.sum(0), None


def conv_silu(x: Tensor, state: Tensor | None, weight: Tensor, bias: Tensor, since: Tensor | None) -> Tensor:
    """silu(out) for out[t] = bias + sum_j weight[:, j] * x[t - (K - 1 - j)] (nn.Conv1d's tap layout), reading the
    K - 1 inputs before x from state [Bt, K - 1, C] (None: zeros). since: None or int [Bt, T], steps since the latest
    document start; a tap further back than that is dropped. Computed in float32 (float64 for float64 x), returned in
    x's dtype; float32, float64 and bfloat16 x (and state) are read and written in place, any other dtype goes
    through float32. Arguments already checked (layers.mamba.ShortConv)."""
    io = x.dtype if x.dtype in IO_DTYPES else torch.float32
    cd = compute_dtype(io)
    xc = x.to(io)
    if xc.stride(2) != 1 or xc.stride(0) != xc.shape[1] * xc.stride(1):  # rows evenly spaced: read in place
        xc = xc.contiguous()
    st = None if state is None or state.shape[1] == 0 else state.to(io).contiguous()
    sc = None if since is None else since.to(torch.int64).contiguous()
    out = _ConvSiLU.apply(xc, st, weight.to(cd).t().contiguous(), bias.to(cd).contiguous(), sc)
    return out.to(x.dtype)


# ---------------------------------------------------------------------------------------------------------------------
# the gated SiLU: silu(g) * u

GATE_ROWS = 16  # rows per work item of the gate; must equal GATE_ROWS in the C source


def gate_takes(*tensors: Tensor) -> bool:
    """Whether the gate kernel runs for these tensors: all on the CPU, of one shape (no broadcasting) and one dtype,
    float32, float64 or bfloat16 (read and written in place, computed in float32: one rounding per output, where
    torch's bfloat16 ops round silu(g) before the product), and the kernel available (built)."""
    first = tensors[0]
    return (first.dtype in IO_DTYPES
            and all(t.device.type == "cpu" and t.dtype == first.dtype and t.shape == first.shape for t in tensors)
            and available())


def _rows(t: Tensor) -> Tensor:
    """t as [M, F] with contiguous rows at an even spacing: a view where t's layout allows it, else a copy."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _gate_forward(g2: Tensor, u2: Tensor) -> Tensor:
    M, F = g2.shape
    out = g2.new_empty(M, F)
    args = (_ptr(g2), g2.stride(0), _ptr(u2), u2.stride(0), _ptr(out), M, F)
    _run("silu_mul_fwd", g2.dtype, -(-M // GATE_ROWS), args)
    return out


def _gate_backward(dout: Tensor, g2: Tensor, u2: Tensor, dg: Tensor, du: Tensor) -> None:
    M, F = g2.shape
    dout = dout.reshape(M, F).to(g2.dtype).contiguous()
    args = (_ptr(dout), _ptr(g2), g2.stride(0), _ptr(u2), u2.stride(0), _ptr(dg), dg.stride(0), _ptr(du),
            du.stride(0), M, F)
    _run("silu_mul_bwd", g2.dtype, -(-M // GATE_ROWS), args)


def _glu_forward(h2: Tensor) -> Tensor:
    """silu(gate) * up for h2 = [gate | up] as [M, 2F] rows."""
    F = h2.shape[1] // 2
    return _gate_forward(h2[:, :F], h2[:, F:])


class _SiluMul(torch.autograd.Function):
    """silu(g) * u for two tensors of one shape; saves the inputs only (the backward recomputes the sigmoid)."""

    @staticmethod
    def forward(ctx, g, u):
        g2, u2 = _rows(g), _rows(u)
        ctx.save_for_backward(g2, u2)
        ctx.shape = g.shape
        return _gate_forward(g2, u2).view(g.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        g2, u2 = ctx.saved_tensors
        dg, du = g2.new_empty(g2.shape), u2.new_empty(u2.shape)
        _gate_backward(dout, g2, u2, dg, du)
        return dg.view(ctx.shape), du.view(ctx.shape)


class _GluSilu(torch.autograd.Function):
    """silu(gate) * up for h = [gate | up] on the last dim; the gradient comes back as one tensor of h's shape."""

    @staticmethod
    def forward(ctx, h):
        h2 = _rows(h)
        ctx.save_for_backward(h2)
        ctx.shape = h.shape
        return _glu_forward(h2).view(*h.shape[:-1], h.shape[-1] // 2)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        (h2,) = ctx.saved_tensors
        F = h2.shape[1] // 2
        dh = h2.new_empty(h2.shape)
        _gate_backward(dout, h2[:, :F], h2[:, F:], dh[:, :F], dh[:, F:])
        return dh.view(ctx.shape)


def silu_mul(g: Tensor, u: Tensor) -> Tensor:
    """silu(g) * u (Mamba's output gate, g = z) through the kernel, for tensors that gate_takes."""
    if not needs_grad(g, u):
        return _gate_forward(_rows(g), _rows(u)).view(g.shape)
    return _SiluMul.apply(g, u)


def glu_silu(h: Tensor) -> Tensor:
    """SwiGLU's silu(gate) * up for h = [gate | up] on the last dim, through the kernel, for an h that gate_takes."""
    if not needs_grad(h):
        return _glu_forward(_rows(h)).view(*h.shape[:-1], h.shape[-1] // 2)
    return _GluSilu.apply(h)


# ---------------------------------------------------------------------------------------------------------------------
# the gather-sum of rows: the mixtures of experts' read-back

GATHER_ROWS = 32  # output rows per work item of the gather-sum; must equal GATHER_ROWS in the C source


def gather_sum_takes(src: Tensor, weights: Tensor) -> bool:
    """Whether the gather-sum kernel runs for rows src [S, D] and their weights: on the CPU, src float32, float64 or
    bfloat16, the weights in its compute dtype (float32 for bfloat16 rows: the sums accumulate in float32, the
    weights' gradient too), and the kernel available (built)."""
    return (src.device.type == "cpu" and src.dtype in IO_DTYPES and src.dim() == 2
            and weights.device.type == "cpu" and weights.dtype == compute_dtype(src.dtype) and available())


def _gather_sum_forward(src: Tensor, idx: Tensor, w: Tensor) -> Tensor:
    M, m = idx.shape
    out = src.new_empty(M, src.shape[1])
    if M and m:
        _run("gather_sum_fwd", src.dtype, -(-M // GATHER_ROWS),
             (_ptr(src), _ptr(idx), _ptr(w), _ptr(out), M, m, src.shape[1]))
    elif M:
        out.zero_()
    return out


class _WeightedGatherSum(torch.autograd.Function):
    """out[n] = sum_j w[n, j] src[idx[n, j]], where no row of src is read twice (the backward stores each row's
    gradient instead of adding to it)."""

    @staticmethod
    def forward(ctx, src, idx, w):
        ctx.save_for_backward(src, idx, w)
        return _gather_sum_forward(src, idx, w)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        src, idx, w = ctx.saved_tensors
        M, m = idx.shape
        # Every row is written where the entries read as many rows as src has (all of them, none twice: the MLP's
        # combine); else the rows that no entry reads (the read-back's padding slots) start at zero.
        dsrc = torch.empty_like(src) if idx.numel() == src.shape[0] else torch.zeros_like(src)
        dw = torch.empty_like(w)
        if M and m:
            dout = dout.to(src.dtype).contiguous()
            _run("gather_sum_bwd", src.dtype, -(-M // GATHER_ROWS),
                 (_ptr(dout), _ptr(src), _ptr(idx), _ptr(w), _ptr(dsrc), _ptr(dw), M, m, src.shape[1]))
        return (dsrc if ctx.needs_input_grad[0] else None), None, (dw if ctx.needs_input_grad[2] else None)


def weighted_gather_sum(src: Tensor, idx: Tensor, weights: Tensor) -> Tensor:
    """out[n] = sum_j weights[n, j] src[idx[n, j]] for src [S, D], idx [N, m] and weights [N, m], differentiable in
    src and weights, where no row of src is read twice (each expert slot is one token's). One pass each way (the
    backward reads each output gradient row and each slot's row once for both gradients). For tensors that
    gather_sum_takes."""
    src, idx, w = src.contiguous(), idx.to(torch.int64).contiguous(), weights.contiguous()
    if not needs_grad(src, w):
        return _gather_sum_forward(src, idx, w)
    return _WeightedGatherSum.apply(src, idx, w)
