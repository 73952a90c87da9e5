"""Helpers shared by the Mamba and MossNet tests."""

import math

import torch


def randomize_(module, seed=0):
    """Asymmetric random weights of a useful scale (so that transposes and swapped pieces or experts show)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 2.0 - 1.5)  # decays exp(dt A) well inside (0, 1)
    return module


def spy_kernel_scan(monkeypatch) -> list:
    """Record the dtype of ``u`` at every call of the compiled scan (the calls still run); returns the list."""
    from linlm.ops import scan_kernel

    dtypes, real = [], scan_kernel.kernel_scan
    monkeypatch.setattr(scan_kernel, "kernel_scan", lambda u, *a, **k: dtypes.append(u.dtype) or real(u, *a, **k))
    return dtypes


def bf16_outputs_and_grads(m, x, w, forward) -> list:
    """Output and gradients (input, then every parameter) of ``m`` under bf16 autocast, for the loss
    ``sum(y * w) + extra`` where ``forward(x) -> (y, extra)``."""
    xl = x.clone().requires_grad_(True)
    m.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, extra = forward(xl)
    ((y.float() * w).sum() + extra).backward()
    return [y.detach().float(), xl.grad] + [p.grad.clone() for p in m.parameters()]


def assert_near_in_norm(m, got, want, rel: float) -> None:
    """Each of output, input gradient and parameter gradients finite and within ``rel`` of ``want`` in norm."""
    names = ["y", "x", *(n for n, _ in m.named_parameters())]
    for name, a, b in zip(names, got, want):
        assert torch.isfinite(a).all(), name
        assert (a - b).norm() <= rel * b.norm(), f"{name}: {(a - b).norm() / b.norm():.3g}"
