"""The compiled conv + SiLU (linlm.ops.conv_kernel, through layers.mamba.ShortConv) against torch's taps, in
float64 and bfloat16."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import BF16, BF16_ROUNDING, F64, assert_rounded_once, bf16_and_f32_kernels, bf16_cotangent
from kernel_checks import leaf, needs_kernel

from linlm.ops import conv_kernel, kernel_library


@needs_kernel
@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("T", [1, 3, 50, 300])
def test_conv_silu_kernel_matches_the_torch_conv(K, T, monkeypatch):
    """ShortConv(silu=True) through the kernel against the torch taps + F.silu: outputs, new states and gradients
    of x, the state, the weights and the bias, with and without documents. T = 300 spans three blocks of 128 steps
    (the backward's halo across blocks); the work items are split over 3 threads."""
    from linlm.layers.mamba import ShortConv

    torch.manual_seed(40 + K + T)
    conv = ShortConv(70, K).double()
    x = torch.randn(2, T, 70, dtype=F64)
    state = torch.randn(2, K - 1, 70, dtype=F64)
    reset = torch.zeros(2, T, dtype=torch.bool)
    reset[0, T // 2] = True
    reset[1, 0] = True
    if T > 200:
        reset[1, 127:130] = True  # documents starting around a block boundary
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    for st, rs in [(None, None), (state, None), (state, reset)]:
        outs = []
        for backend in ("kernel", "torch"):
            monkeypatch.setenv("LINLM_SCAN_BACKEND", backend)
            conv.zero_grad()
            xl = x.clone().requires_grad_(True)
            sl = None if st is None else st.clone().requires_grad_(True)
            out, new_state = conv(xl, sl, rs, silu=True)
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
            (out * g).sum().backward()
            outs.append([out, new_state, xl.grad, None if sl is None else sl.grad, conv.weight.grad.clone(),
                         conv.bias.grad.clone()])
        for name, a, b in zip(["out", "state", "dx", "dstate", "dw", "dbias"], *outs):
            if a is None or b is None:  # no state, or an empty one (K = 1): no gradient either way
                assert (a if b is None else b) is None or (a if b is None else b).numel() == 0, name
                continue
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda m: f"{name}: {m}")


@needs_kernel
@pytest.mark.parametrize("T", [1, 37])
def test_conv_silu_kernel_reads_one_half_of_a_projection_in_place(T):
    """x given as the first half of a [Bt, T, 2C] tensor (as Mamba's in_proj output is split) is read in place,
    with the same outputs and gradients as a contiguous copy."""
    torch.manual_seed(7)
    w, bias = torch.randn(70, 4, dtype=F64), torch.randn(70, dtype=F64)
    state = torch.randn(2, 3, 70, dtype=F64)
    since = torch.tensor([[t for t in range(T)], [t % 5 for t in range(T)]])
    full = torch.randn(2, T, 140, dtype=F64)
    g = torch.randn(2, T, 70, dtype=F64)
    results = []
    for make in (lambda f: f.chunk(2, dim=-1)[0], lambda f: f[..., :70].contiguous()):
        f = full.clone().requires_grad_(True)
        x = make(f)
        assert x.is_contiguous() == (len(results) == 1)
        out = conv_kernel.conv_silu(x, state, w, bias, since)
        (out * g).sum().backward()
        results.append((out, f.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)

@needs_kernel
@pytest.mark.parametrize("T", [1, 50, 300])
def test_bfloat16_conv_silu_against_float64_and_the_float32_kernel(T):
    """The conv + SiLU on bfloat16 x and state (x one half of a projection, read in place; documents): the output
    and the gradients of x and of the state are bfloat16, the float64 conv's values rounded once; the weights' and
    bias' gradients (float32) are the float32 kernel's; and every bfloat16 output is the float32 kernel's rounded."""
    gen = torch.Generator().manual_seed(T)
    w, bias = torch.randn(70, 4, generator=gen), torch.randn(70, generator=gen)
    full = torch.randn(2, T, 140, generator=gen).to(BF16)
    state = torch.randn(2, 3, 70, generator=gen).to(BF16)
    since = torch.tensor([[t for t in range(T)], [t % 37 for t in range(T)]])
    dy = bf16_cotangent((2, T, 70), 5)

    def run(dtype, fn=conv_kernel.conv_silu):
        leaves = [leaf(t, dtype) for t in (full, state)] + [leaf(t, kernel_library.compute_dtype(dtype)) for t in (w, bias)]
        out = fn(leaves[0][..., :70], leaves[1], leaves[2], leaves[3], since)
        (out.double() * dy.double()).sum().backward()
        return [out.detach(), leaves[0].grad, leaves[1].grad, leaves[2].grad, leaves[3].grad]

    def float64_conv(x, st, wt, b, since):
        xs = torch.cat([st, x], dim=1)  # [Bt, K - 1 + T, C]
        out = b + sum(xs[:, j:j + x.shape[1]] * wt[:, j] * (since >= 3 - j)[..., None] for j in range(4))
        return torch.nn.functional.silu(out)

    got, want = bf16_and_f32_kernels(run)
    exact = run(F64, float64_conv)
    for i, name in enumerate(["out", "dx", "dstate"]):
        assert_rounded_once(got[i if i == 0 else i], want[i], name)
    tol = dict(rtol=BF16_ROUNDING + 1e-5, atol=1e-5)
    torch.testing.assert_close(got[0].double(), exact[0], **tol)
    torch.testing.assert_close(got[1][..., :70].double(), exact[1][..., :70], **tol)
    torch.testing.assert_close(got[2].double(), exact[2], **tol)
    for i, name in ((3, "dw"), (4, "dbias")):
        assert got[i].dtype == torch.float32
        torch.testing.assert_close(got[i], want[i], rtol=1e-6, atol=1e-6, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(got[i].double(), exact[i], rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
