"""A Mamba language model's decoding step in one kernel call (linlm.models.fused_step): the same bits as the step
through its modules (float32 and int8, tied and untied heads, projections with biases, 1 and 2 threads), and every
model or input it leaves to the modules."""

from __future__ import annotations

import pytest
import torch

import linlm
from linlm.models import fused_step as fused_module
from linlm.models import lm as lm_module
from linlm.ops import gemv_kernel, kernel_library, step_kernel

needs_kernel = pytest.mark.skipif(not kernel_library.available(), reason="no C compiler: the kernel is not built")
has_fbgemm = bool({"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines))


def mamba(seed=0, **kw):
    torch.manual_seed(seed)
    return linlm.create_model("mamba", None, **{"n_layers": 3, "d_model": 64, "vocab_size": 97, **kw}).eval()


def decode(model, ids, steps=4):
    """Logits of ``steps`` steps after a prefill of ids[:, :-steps], and the final state."""
    logits, state = model.prefill(ids[:, :-steps])
    out = []
    for t in range(ids.shape[1] - steps, ids.shape[1]):
        logits, state = model.step(ids[:, t], state)
        out.append(logits)
    return torch.stack(out), state


def counted(monkeypatch):
    calls = []
    real = step_kernel.mamba_model_step
    monkeypatch.setattr(step_kernel, "mamba_model_step", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    return calls


def assert_same_bits(a, b):
    assert torch.equal(a[0], b[0])
    assert a[1].offset == b[1].offset
    for x, y in zip(a[1].layers, b[1].layers):
        assert torch.equal(x["conv"], y["conv"]) and torch.equal(x["ssm"], y["ssm"])


def through_modules(monkeypatch, model, ids):
    """The step through the modules, its head on the gemv kernel whatever its size (as the fused step's)."""
    with monkeypatch.context() as mp:
        mp.setattr(lm_module, "fused_step", lambda *a: None)
        mp.setattr(gemv_kernel, "GEMV_MIN_WEIGHTS", 0)
        return decode(model, ids)


@needs_kernel
@pytest.mark.parametrize("kind", ["tied", "untied", "int8"])
def test_one_call_per_step_with_the_bits_of_the_modules(monkeypatch, kind):
    """The fused step runs the mixer stages, norms and head as the modules' kernels do, row by row in the same
    order: the logits and states are equal, not close (int8: the int8 kernel's products in both)."""
    if kind == "int8" and not has_fbgemm:
        pytest.skip("no fbgemm int8 kernels: int8 models do not load")
    model = mamba(tie_embeddings=kind != "untied")
    if kind == "int8":
        from linlm.models.quant import quantize_model

        model = quantize_model(model)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    calls = counted(monkeypatch)
    got = decode(model, ids)
    assert calls == [2] * 4
    assert_same_bits(got, through_modules(monkeypatch, model, ids))


@needs_kernel
def test_two_threads_biases_and_a_conv_without_bias_change_no_bit(monkeypatch):
    model = mamba(seed=2)
    with torch.no_grad():
        for layer in model.layers:
            for lin in (layer.mixer.in_proj, layer.mixer.x_proj, layer.mixer.out_proj):
                lin.bias = torch.nn.Parameter(torch.randn(lin.out_features))
    model.layers[1].mixer.conv.bias = None
    ids = torch.randint(0, 97, (3, 8), generator=torch.Generator().manual_seed(2))
    calls = counted(monkeypatch)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = decode(model, ids)
        torch.set_num_threads(2)
        two = decode(model, ids)
    finally:
        torch.set_num_threads(threads)
    assert len(calls) == 8
    assert_same_bits(one, two)
    assert_same_bits(one, through_modules(monkeypatch, model, ids))


@needs_kernel
def test_what_the_fused_step_leaves_to_the_modules(monkeypatch):
    """A hook anywhere (it must run), more rows than a decoding step's, another dtype, a hybrid stack, another
    architecture: the modules step, and their hooks see the step."""
    calls = counted(monkeypatch)
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(4))
    model = mamba(seed=4)
    seen = []
    for module in (model.layers[2].norm1, model.layers[0], model.norm, model.layers[1].mixer, model):
        handle = module.register_forward_hook(lambda m, i, o: seen.append(1))
        seen.clear()
        decode(model, ids)
        handle.remove()
        assert calls == [] and len(seen) == 1 + 4, type(module).__name__  # the prefill's call and each step's
    plain = decode(model, ids)[0]  # the one-call step
    seen.clear()
    calls.clear()
    handle = model.layers[1].mixer.conv.register_forward_hook(lambda m, i, o: seen.append(1))
    hooked = decode(model, ids)[0]
    handle.remove()
    assert calls == [] and len(seen) == 1 + 4  # the conv's hook runs in each step too, not only in the prefill
    torch.testing.assert_close(hooked, plain, rtol=1e-5, atol=1e-6)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        decode(model, ids)
    finally:
        handle.remove()
    assert calls == []
    decode(model, torch.randint(0, 97, (9, 6)))  # 9 rows
    assert calls == []
    decode(model.to(torch.float64), ids)
    assert calls == []
    decode(mamba(seed=5, attn_layers=[1]), ids)  # a hybrid: attention's KV cache
    decode(linlm.create_model("mossnet", "tiny", vocab_size=97).eval(), ids)
    assert calls == []
    decode(mamba(seed=6), ids)
    assert calls == [2] * 4


def test_the_table_columns_are_the_c_indices():
    """mamba_model_step's layer table: its Python column names in the order of the C source's STEP_F_* defines."""
    import re

    text = (kernel_library.KERNEL_DIR / "_step_kernel.c").read_text()
    defines = dict(re.findall(r"^#define STEP_F_(\w+) (\d+)$", text, flags=re.M))
    names = {"NORM": "norm", "WIN": "w_in", "SCIN": "sc_in", "BIN": "b_in", "CONVW": "conv_w", "CONVB": "conv_b",
             "WX": "w_x", "SCX": "sc_x", "BX": "b_x", "DTW": "dt_w", "DTB": "dt_b", "A": "A", "D": "D",
             "WOUT": "w_out", "SCOUT": "sc_out", "BOUT": "b_out", "ST": "st", "SS": "ss", "S": "s",
             "NEWST": "new_st", "SOUT": "s_out"}
    assert {names[k]: int(v) for k, v in defines.items()} == {n: i for i, n in enumerate(step_kernel.STEP_FIELDS)}
    assert re.search(r"^#define STEP_FIELDS (\d+)$", text, flags=re.M).group(1) == str(len(step_kernel.STEP_FIELDS))
    assert fused_module.fused_step.__module__ == "linlm.models.fused_step"


def test_another_architectures_step_checks_its_input_once_and_computes_no_embedding_twice(monkeypatch):
    """model_takes answers from the modules alone: a LLaMA or HGRN2 step never reaches the fused step's tensor
    work, and its input is checked once (by forward), as before the fused step existed."""
    for arch in ("llama", "hgrn2"):
        torch.manual_seed(0)
        model = linlm.create_model(arch, None, n_layers=2, d_model=32, n_heads=2, vocab_size=50).eval()
        assert not fused_module.model_takes(model)
        _, state = model.prefill(torch.randint(0, 50, (1, 4)))
        checks, embeds = [], []
        real = model._check_ids
        monkeypatch.setattr(model, "_check_ids", lambda *a: checks.append(a[0]) or real(*a))
        handle = model.embed.register_forward_hook(lambda m, i, o: embeds.append(1))
        model.step(torch.tensor([3]), state)
        handle.remove()
        assert checks == ["input_ids"] and embeds == [1], arch
    assert fused_module.model_takes(mamba())
