"""`linlm check` says which kernels are active."""

from __future__ import annotations

from linlm.cli import main
from linlm.commands.check import kernel_report
from linlm.ops import gemv_kernel, kernel_library


def test_report_follows_the_backend_setting(monkeypatch):
    monkeypatch.setenv("LINLM_SCAN_BACKEND", "torch")
    assert kernel_report()["C kernels"].startswith("off (LINLM_SCAN_BACKEND=torch)")
    assert kernel_report()["int8 decoding sums"].startswith("the C kernels are off")
    monkeypatch.delenv("LINLM_SCAN_BACKEND")
    report = kernel_report()
    assert report["C kernels"].startswith("active" if kernel_library.available() else "not built")
    assert report["torch CPU capability"]
    if kernel_library.available():
        assert report["int8 decoding sums"].split(" (")[0] in gemv_kernel.Q8_FORMS


def test_check_prints_the_report_first(capsys):
    assert main(["check", "--archs", "mamba"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("C kernels: ") and out[1].startswith("int8 GEMM (fbgemm): ")
