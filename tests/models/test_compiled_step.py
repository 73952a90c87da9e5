"""CausalLM.compile_step: the torch.compile'd decoding step computes what the eager one does, and steps aside
where it cannot (a growing KV cache, per-row offsets, a compile that fails)."""

import shutil
import warnings

import pytest
import torch

from linlm import create_model
from linlm.models.quant import quantize_model

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                               reason="torch.compile on the CPU needs a C++ compiler")


def _tiny(arch, **kw):
    torch.manual_seed(0)
    return create_model(arch, d_model=32, n_layers=2, n_heads=2, vocab_size=64, **kw).eval()


def _steps_agree(model, steps=4, batch=2):
    """Decode `steps` greedy tokens from one prompt twice, compiled and eager; return the largest logit gap and the
    offsets the compiled states carried."""
    ids = torch.randint(0, model.config.vocab_size, (batch, 5), generator=torch.Generator().manual_seed(1))
    logits, state_c = model.prefill(ids)
    _, state_e = model.prefill(ids)
    token, gap, offsets = logits.argmax(-1), 0.0, []
    for _ in range(steps):
        lc, state_c = model.step(token, state_c)
        compiled, model._compiled_step = model._compiled_step, None
        le, state_e = model.step(token, state_e)
        model._compiled_step = compiled
        gap = max(gap, float((lc - le).abs().max()))
        offsets.append(state_c.offset)
        token = lc.argmax(-1)
    return gap, offsets


@needs_cxx
@pytest.mark.parametrize("arch", ["mamba", "cosformer2", "mamba2", "mossnet"])
def test_compiled_step_equals_eager(arch):
    # mamba: no position in the step; cosformer2: an embedding mixer and a position (the offset recompiles once as a
    # dynamic int); mamba2: a step whose eager form calls the C kernels, which step aside while torch compiles;
    # mossnet: routed experts, whose grouping by expert the graph replaces by per-token weight gathers.
    torch._dynamo.reset()
    model = _tiny(arch)
    assert model.compile_step()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager would warn
        gap, offsets = _steps_agree(model)
    assert model.step_compiled
    assert gap < 1e-5
    assert offsets == [6, 7, 8, 9]


@needs_cxx
def test_compiled_int8_step_equals_eager():
    torch._dynamo.reset()
    model = quantize_model(_tiny("mamba"))
    assert model.compile_step()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        gap, _ = _steps_agree(model)
    assert model.step_compiled
    assert gap < 1e-5


def test_growing_state_is_not_compiled():
    assert not _tiny("llama").compile_step()
    assert not _tiny("hgrn2", attn_layers=[1]).compile_step()  # a hybrid's attention layer keeps a KV cache
    model = _tiny("mamba")
    assert model.compile_step()
    assert not model.compile_step(False)
    assert not model.step_compiled


def test_failed_compile_falls_back_to_eager_with_a_warning():
    model = _tiny("mamba")
    ids = torch.tensor([[1, 2, 3]])
    _, state = model.prefill(ids)
    want, _ = model.step(torch.tensor([4]), state)

    def broken(*args):
        raise RuntimeError("no compiler here")

    model._compiled_step = broken
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        got, new_state = model.step(torch.tensor([4]), state)
    assert torch.equal(got, want)
    assert new_state.offset == 4
    assert not model.step_compiled


def test_compiled_step_still_checks_its_input():
    model = _tiny("mamba")
    _, state = model.prefill(torch.tensor([[1, 2, 3]]))
    model._compiled_step = lambda *a: pytest.fail("the compiled step ran on bad input")
    with pytest.raises(Exception, match="vocabulary"):
        model.step(torch.tensor([64]), state)
