"""Running a compiled kernel's work items on threads: in torch's OpenMP pool, or on Python threads of their own.

Every entry point of the kernel library (linlm.ops.kernel_library) processes a range of independent work items (a
batch row's tile of channels, a block of time steps or of rows), which are split over ``torch.get_num_threads()``
threads. Built with ``-fopenmp`` (gcc, clang with libomp), the library's NAME_par entry points run them in torch's
own OpenMP pool (the process loads one libgomp, torch's): after each of torch's parallel ops the pool's worker spins
for a while, and a kernel on threads of its own then shares the cores with that spinning thread, which slows a
kernel that runs right after a matmul (benchmarks/bench_kernel_threads.py measures this). Built without OpenMP, the
items go to Python threads, contiguous ranges of them per thread (ctypes releases the GIL).
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from linlm.ops import kernel_library
from linlm.ops.kernel_library import EntryPoint

__all__ = ["openmp_pool", "own_threads", "run", "workers"]

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
    return _use_pool and kernel_library.openmp()


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


def workers(n_items: int) -> int:
    """Threads that n_items work items run on (run), and so the per-thread scratch rows a call needs."""
    return max(1, min(torch.get_num_threads(), n_items))


def run(call: EntryPoint, dtype: torch.dtype, n_items: int) -> None:
    """Run the entry point with the arguments ``call`` (its variant for activations of ``dtype``: float32, float64
    or bfloat16) over n_items work items: in torch's OpenMP pool where the library has the NAME_par entry points
    (outside own_threads()), else over contiguous ranges of the items on Python threads. An entry point with
    per-thread scratch gets row i of its scratch field [workers(n_items), size] for thread i."""
    n = workers(n_items)
    par = kernel_library.function(type(call), dtype, parallel=True) if n > 1 and _use_pool else None
    if par is not None:
        par(*call.par_args(), n_items, n)
        return
    fn = kernel_library.function(type(call), dtype)
    if n == 1:
        fn(*call.c_args(), 0, n_items)
        return
    bounds = [n_items * i // n for i in range(n + 1)]
    futures = [_executor(n).submit(fn, *call.c_args(thread=i), bounds[i], bounds[i + 1]) for i in range(n)]
    for f in futures:
        f.result()
