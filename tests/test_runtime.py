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
