"""Decoding steps on linlm's matrix-vector kernel (linlm.layers.linear over linlm.ops.gemv_kernel): the models'
Linear layers and head take it for a step's few rows, give the logits F.linear gives, and leave training alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers import linear as linear_module
from linlm.layers.linear import DecodeLinear
from linlm.models.lm import create_model
from linlm.ops import gemv_kernel, kernel_library, step_kernel

needs_kernel = pytest.mark.skipif(not kernel_library.available(), reason="no C compiler: the kernel is not built")


def test_every_linear_of_a_model_decodes_through_the_kernel_class():
    """The models' nn.Linear layers become DecodeLinear: still nn.Linear to every isinstance, with the same state
    dict keys as a model whose layers are plain nn.Linear."""
    model = create_model("mamba", d_model=32, n_layers=2, vocab_size=64, tie_embeddings=False)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is DecodeLinear for m in linears)
    plain = {k for k, _ in model.state_dict().items()}
    for m in linears:
        m.__class__ = nn.Linear
    assert {k for k, _ in model.state_dict().items()} == plain


@needs_kernel
@pytest.mark.parametrize("arch", ["mamba", "llama", "hgrn2"])
def test_a_decoding_step_on_the_kernel_matches_f_linear(arch, monkeypatch):
    """The same greedy step of a small model with its products on the kernel (counted: every Linear and the head
    take it) and on F.linear: the logits agree to float32 summation; training's forward and backward never reach
    the kernel."""
    monkeypatch.setattr(gemv_kernel, "GEMV_MIN_WEIGHTS", 0)  # every layer of this small model
    # Mamba's mixer would step in one fused call (tests/ops/test_step_kernel.py): here its Linear layers' own path
    monkeypatch.setattr(step_kernel, "mamba_mixer_step_takes", lambda *a: False)
    torch.manual_seed(0)
    model = create_model(arch, d_model=64, n_heads=4, n_layers=2, vocab_size=96, tie_embeddings=False).eval()
    n_linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    ids = torch.tensor([[5, 17, 3, 40, 2, 9]])
    calls = []

    def counted(*args):
        calls.append(args[1].shape)
        return gemv_kernel.small_linear(*args)

    monkeypatch.setattr(linear_module, "small_linear", counted)
    with torch.no_grad():
        _, state = model.prefill(ids)
        calls.clear()
        kernel_logits, _ = model.step(torch.tensor([7]), state)
        assert len(calls) == n_linears  # the head is one of them
        monkeypatch.setattr(linear_module, "small_linear_takes", lambda *a: False)
        _, state = model.prefill(ids)
        plain_logits, _ = model.step(torch.tensor([7]), state)
    torch.testing.assert_close(kernel_logits, plain_logits, rtol=1e-4, atol=1e-5)
    assert torch.equal(kernel_logits.argmax(-1), plain_logits.argmax(-1))

    monkeypatch.setattr(linear_module, "small_linear_takes", gemv_kernel.small_linear_takes)
    calls.clear()
    model.train()
    loss = F.cross_entropy(model(ids[:, :1]).flatten(0, 1), ids[0, :1])  # one token: within the row limit
    loss.backward()
    assert calls == [] and model.embed.weight.grad is not None


def test_decode_weights_names_what_a_fused_kernel_may_read_in_a_layers_place():
    """A plain Linear (or DecodeLinear) gives its weight and bias; int8 layers their q and scales; a subclass, whose
    forward may compute something else, and a layer with a hook, which must run, give None."""
    from linlm.layers.linear import decode_weights

    lin = nn.Linear(8, 4)
    w, s, b = decode_weights(lin)
    assert w is lin.weight and s is None and b is lin.bias
    lin.__class__ = DecodeLinear
    assert decode_weights(lin)[0] is lin.weight

    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    assert decode_weights(Scaled(8, 4)) is None
    handle = lin.register_forward_pre_hook(lambda m, i: None)
    assert decode_weights(lin) is None
    handle.remove()
    if {"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines):
        from linlm.models.quant import QuantLinear

        q = QuantLinear.from_float(torch.randn(4, 8))
        w, s, b = decode_weights(q)
        assert w.dtype == torch.int8 and s.shape == (4,) and b is None
        assert decode_weights(QuantLinear(8, 4)) is None  # a shell without weights yet
