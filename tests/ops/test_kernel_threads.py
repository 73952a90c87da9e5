"""The runner of the compiled kernels' work items (linlm.ops.kernel_threads): torch's OpenMP pool or Python threads,
bitwise the result of one thread."""

from __future__ import annotations

import contextlib

import pytest
import torch
from kernel_checks import needs_kernel
from test_selective_scan import assert_close_all, make_inputs, run_with_grads

from linlm.ops import gate_kernel, gather_sum_kernel, kernel_threads
from linlm.ops.selective_scan import selective_scan_kernel


def _all_kernels(x, gate_in):
    """The scan with its gradients, then the conv + SiLU, the gate and the gather-sum, forward and backward."""
    from linlm.layers.mamba import ShortConv

    out = run_with_grads(selective_scan_kernel, x)
    torch.manual_seed(3)
    conv = ShortConv(200, 4)
    xc = gate_in.clone().requires_grad_(True)
    y, _ = conv(xc, None, None, silu=True)
    g, u = gate_in.clone().requires_grad_(True), gate_in.flip(1).clone().requires_grad_(True)
    z = gate_kernel.silu_mul(g, u)
    (y.square().sum() + (z * y.detach()).sum()).backward()
    # the gather-sum of the experts' read-back: 150 tokens of two slots each over 300 rows (none read twice), five
    # of its 32-row items
    rows = gate_in[0].clone().requires_grad_(True)  # [300, 200]
    idx = torch.randperm(300, generator=torch.Generator().manual_seed(6)).view(150, 2)
    w = torch.rand(150, 2, generator=torch.Generator().manual_seed(7)).requires_grad_(True)
    r = gather_sum_kernel.weighted_gather_sum(rows, idx, w)
    (r * gate_in[2, :150]).sum().backward()
    return out, [y, xc.grad, conv.weight.grad, conv.bias.grad, z, g.grad, u.grad, r, rows.grad, w.grad]


@needs_kernel
@pytest.mark.parametrize("runner", ["openmp", "python"])
def test_threads_do_not_change_the_result(runner):
    """The work items are split over threads, in torch's OpenMP pool where the library was built with OpenMP, else
    on Python threads; each item's arithmetic is the same, so the results are bitwise equal to one thread's."""
    x = {k: (v.float() if v is not None else None) for k, v in make_inputs(Bt=3, T=100, Din=200, N=8).items()}
    gate_in = torch.randn(3, 300, 200, generator=torch.Generator().manual_seed(5))
    pool = kernel_threads.openmp_pool()
    if runner == "openmp" and not pool:
        pytest.skip("the kernel was built without OpenMP (the compiler has no -fopenmp)")
    was = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _all_kernels(x, gate_in)
        torch.set_num_threads(3)
        with kernel_threads.own_threads() if runner == "python" else contextlib.nullcontext():
            assert kernel_threads.openmp_pool() == (runner == "openmp")
            three = _all_kernels(x, gate_in)
    finally:
        torch.set_num_threads(was)
    assert kernel_threads.openmp_pool() == pool  # own_threads() is undone on leaving the block
    assert_close_all(three[0], one[0], rtol=0, atol=0)
    for i, (a, b) in enumerate(zip(three[1], one[1])):
        assert torch.equal(a, b), f"conv / gate / gather-sum output {i}"
