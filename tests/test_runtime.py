"""linlm.runtime: the allocator settings are applied on glibc, once, and can be switched off."""

import subprocess
import sys

import pytest

from linlm import runtime

glibc = pytest.mark.skipif(runtime._glibc() is None, reason="the allocator settings are glibc's")

PROBE = "from linlm.runtime import tune_allocator as t; print(t()); print(t())"


def run_probe(env_value):
    env = {"PATH": "/usr/bin:/bin"}
    if env_value is not None:
        env["LINLM_ALLOCATOR"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
    return out.stdout.splitlines()


@glibc
def test_tune_allocator_applies_every_setting_once():
    first, second = run_probe(None)
    assert first == second == str(runtime.SETTINGS)


@pytest.mark.parametrize("value", ["system", " System "])
def test_linlm_allocator_system_leaves_it_alone(value):
    assert run_probe(value) == ["None", "None"]


@pytest.mark.parametrize("name", sorted(runtime.SETTINGS))
def test_every_setting_fits_mallopts_c_int(name):
    """ctypes passes an int too large for a C int cut to its low 32 bits, without an error (4 GiB arrives as 0)."""
    assert runtime.C_INT_MIN <= runtime.SETTINGS[name] <= runtime.C_INT_MAX


REUSE = """
import ctypes, resource
from linlm.runtime import tune_allocator
tune_allocator()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
def faults_touching(n):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    libc.free(p)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults_touching(600 << 20), faults_touching(600 << 20))
"""


@glibc
def test_freed_memory_is_reused_without_fresh_page_faults():
    """With the settings, a block freed and allocated again comes back from the heap already mapped: touching it
    the second time costs few page faults. (The trim threshold once reached glibc as 0: the heap was trimmed to its
    256 MiB pad at every free, and the second touch of 600 MiB faulted 344 MiB of pages afresh.)"""
    out = subprocess.run([sys.executable, "-c", REUSE], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, check=True)
    first, second = (int(n) for n in out.stdout.split())
    assert first > 100_000  # 600 MiB of fresh 4 KiB pages
    assert second < first // 20, (first, second)
