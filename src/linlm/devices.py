"""Device names from the command line or a config: checked before any work, with one-line errors."""

from __future__ import annotations

import re

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
