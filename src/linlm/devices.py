"""Device names from the command line or a config: checked before any work, with one-line errors."""

from __future__ import annotations

import re
import warnings

import torch

from linlm.errors import ConfigError

_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")


def resolve_device(spec: str, local_rank: int = 0) -> torch.device:
    """'auto' (CUDA when present, else CPU), 'cpu', 'cuda', 'cuda:N' or 'mps' as a torch.device.

    A name torch does not know, or an accelerator that is not present here, raises ConfigError.
    """
    spec = str(spec).strip().lower()
    if not _DEVICE.fullmatch(spec):
        raise ConfigError(f"device: {spec!r} is not a device; use one of 'auto', 'cpu', 'cuda', 'cuda:N', 'mps'")
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device: {spec!r} was asked for but CUDA is not available here; use cpu (--device cpu, or device: cpu in a config)")
        if spec == "cuda":
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        index = int(spec.split(":")[1])
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device: {spec!r} does not exist; this machine has {torch.cuda.device_count()} "
                              f"CUDA device(s), cuda:0..cuda:{torch.cuda.device_count() - 1}")
    if spec == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError("device: 'mps' was asked for but is not available here; use cpu")
    return torch.device(spec)


PRECISIONS = ("fp32", "bf16", "auto")


def native_bf16(device: torch.device) -> bool:
    """True where bfloat16 matmuls run at full speed on ``device``: a CUDA device with bf16 support, or a CPU that
    oneDNN drives in bf16 (AVX-512 or AMX; what torch reports as mkldnn bf16 support). On a CPU without it (an
    AVX2-only x86, for one) torch falls back to a reference loop, tens of times slower than float32
    (benchmarks/bench_train_step.py prints both matmul ceilings of the machine it runs on)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """The training precision for ``device``: "auto" is bf16 where the device computes it natively
    (:func:`native_bf16`), else fp32. An explicit "bf16" is kept, with a warning where it is not native (the fix is
    fp32 or auto)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision: {precision!r} is not a precision; use one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return precision
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    warn_slow_bf16(device, "precision bf16", "use precision fp32 or auto (--precision auto: bf16 only where it is "
                                             "native)")
    return precision


def warn_slow_bf16(device: torch.device, what: str, fix: str) -> bool:
    """Warn (once per call) that ``what`` computes in bfloat16 on a ``device`` without native bf16 matmuls, naming
    ``fix``; True when it warned."""
    if native_bf16(device):
        return False
    warnings.warn(f"{what} on {device.type}: this device has no native bfloat16 matmul (on a CPU: no AVX-512 or "
                  f"AMX), so bf16 matmuls take a slow fallback, tens of times slower than fp32; {fix}",
                  RuntimeWarning, stacklevel=2)  # where linlm asked for bf16
    return True
