"""linlm.devices: precision auto picks bf16 only where the device computes it natively; bf16 elsewhere warns."""

import warnings

import pytest
import torch

from linlm import devices
from linlm.errors import ConfigError

CPU = torch.device("cpu")


@pytest.fixture
def bf16_native(monkeypatch):
    def set_native(value: bool):
        monkeypatch.setattr(devices, "native_bf16", lambda device: value)

    return set_native


def test_auto_is_bf16_only_where_native(bf16_native):
    bf16_native(True)
    assert devices.resolve_precision("auto", CPU) == "bf16"
    bf16_native(False)
    assert devices.resolve_precision("auto", CPU) == "fp32"


def test_explicit_precisions_are_kept(bf16_native):
    bf16_native(False)
    assert devices.resolve_precision("fp32", CPU) == "fp32"
    with pytest.warns(RuntimeWarning, match=r"no native bfloat16.*precision fp32 or auto"):
        assert devices.resolve_precision("bf16", CPU) == "bf16"
    bf16_native(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert devices.resolve_precision("bf16", CPU) == "bf16"
        assert devices.resolve_precision("auto", CPU) == "bf16"


def test_unknown_precision_is_refused():
    with pytest.raises(ConfigError, match=r"'fp16' is not a precision.*fp32, bf16, auto"):
        devices.resolve_precision("fp16", CPU)


def test_native_bf16_follows_the_device(monkeypatch):
    """CUDA asks torch.cuda.is_bf16_supported, the CPU asks oneDNN's bf16 support (a missing op counts as none), any
    other device is never native."""
    for value in (True, False):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, v=value, **k: v)
        assert devices.native_bf16(torch.device("cuda")) is value
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda v=value: v)
        assert devices.native_bf16(CPU) is value

    def missing():
        raise RuntimeError("no such op")

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", missing)
    assert devices.native_bf16(CPU) is False
    assert devices.native_bf16(torch.device("meta")) is False


def test_profile_in_bfloat16_warns_where_it_is_not_native_and_the_command_says_it_in_one_line(bf16_native, capsys):
    """`linlm profile --dtype bfloat16` on an AVX2-only CPU timed the slow fallback without a word; now it warns,
    as training does, and the command prints one line."""
    from linlm.cli import _linlm_warnings_on_one_line
    from linlm.infer.profile import profile

    kw = dict(contexts=[8], decode_tokens=1, dtype="bfloat16")
    bf16_native(False)
    with pytest.warns(RuntimeWarning, match=r"--dtype bfloat16 on cpu: this device has no native bfloat16.*float32"):
        profile(["hgrn2"], "tiny", **kw)
    bf16_native(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profile(["hgrn2"], "tiny", **kw)
    bf16_native(False)
    elsewhere = []
    with warnings.catch_warnings():  # restores Python's showwarning afterwards
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, filename, *a, **k: elsewhere.append(filename)
        _linlm_warnings_on_one_line()
        profile(["hgrn2"], "tiny", **kw)
        warnings.warn_explicit("from elsewhere", UserWarning, "/not/linlm/module.py", 7)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("linlm: warning: --dtype bfloat16 on cpu: this device has no native")
    assert elsewhere == ["/not/linlm/module.py"]  # other libraries' warnings go where they went before
