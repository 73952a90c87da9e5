"""The compiled gather-sum (linlm.ops.gather_sum_kernel, the read-back of linlm.ops.routing) on bfloat16 rows;
tests/ops/test_routing.py checks it in float32 and float64 against index arithmetic and embedding_bag."""

from __future__ import annotations

import torch
from kernel_checks import BF16, BF16_ROUNDING, F64, assert_rounded_once, bf16_and_f32_kernels, bf16_cotangent
from kernel_checks import leaf, needs_kernel

from linlm.ops import gather_sum_kernel, kernel_library


@needs_kernel
def test_bfloat16_gather_sum_against_float64_and_the_float32_kernel():
    """The read-back's gather-sum on bfloat16 rows with float32 weights: the output and the rows' gradient are
    bfloat16, the float64 sums rounded once (summed in float32, not in bfloat16), the padding rows' gradient zero;
    the weights' gradient is float32, the float32 kernel's. 70 tokens of 2 slots over 150 rows, 10 never read."""
    gen = torch.Generator().manual_seed(11)
    src = torch.randn(150, 40, generator=gen).to(BF16)
    idx = torch.randperm(150, generator=gen)[:140].view(70, 2)
    w = torch.rand(70, 2, generator=gen)
    dout = bf16_cotangent((70, 40), 7)

    def run(dtype, fn=gather_sum_kernel.weighted_gather_sum):
        s, wl = leaf(src, dtype), leaf(w, kernel_library.compute_dtype(dtype))
        out = fn(s, idx, wl)
        (out.double() * dout.double()).sum().backward()
        return [out.detach(), s.grad, wl.grad]

    got, want = bf16_and_f32_kernels(run)
    exact = run(F64, lambda s, i, v: (v[..., None] * s[i]).sum(1))
    for name, i in (("out", 0), ("dsrc", 1)):
        assert_rounded_once(got[i], want[i], name)
        torch.testing.assert_close(got[i].double(), exact[i], rtol=BF16_ROUNDING + 1e-6, atol=1e-6)
    unread = torch.ones(150, dtype=torch.bool).index_fill_(0, idx.reshape(-1), False)
    assert torch.equal(got[1][unread], torch.zeros(10, 40, dtype=BF16))
    assert got[2].dtype == torch.float32
    torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[2].double(), exact[2], rtol=1e-5, atol=1e-5)
