"""int8 weights (linlm.models.quant, `linlm quantize`): every architecture quantizes, saves and loads; a trained
tiny model keeps its perplexity within 1 % on held-out text, through the prefill path and through decoding steps."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from linlm import create_model
from linlm.cli import main
from linlm.errors import CheckpointError
from linlm.models import quant
from linlm.models.io import load
from linlm.models.quant import DYNAMIC_ROWS, QuantEmbedding, QuantLinear, quantize_rows
from linlm.models.registry import arch_names
from linlm.ops import kernel_library

pytestmark = pytest.mark.skipif(
    not {"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines), reason="no fbgemm int8 kernels")


def _tiny(arch, vocab=64):
    torch.manual_seed(0)
    return create_model(arch, preset="tiny", vocab_size=vocab).eval()


def test_quantize_rows_round_trip_error_is_half_a_step():
    w = torch.randn(37, 53) * torch.linspace(0.1, 3, 37)[:, None]  # rows of different ranges
    w[5] = 0
    q, s = quantize_rows(w)
    assert q.dtype == torch.int8 and s.shape == (37,) and int(q.abs().max()) == 127
    err = (q.float() * s[:, None] - w).abs()
    assert bool((err <= s[:, None] / 2 + 1e-7).all())
    assert bool((q[5] == 0).all())


def test_quant_linear_matches_dequantized_weight_at_every_row_count():
    torch.manual_seed(1)
    w = torch.randn(40, 24)
    lin = QuantLinear.from_float(w)
    assert torch.equal(lin.weight, quantize_rows(w)[0].float() * quantize_rows(w)[1][:, None])
    for rows in (1, 3, 64, 65, 200):  # the int8 GEMM up to DYNAMIC_ROWS, the dequantized weight above
        x = torch.randn(rows, 24)
        ref = x @ lin.weight.T
        tol = 0.02 * ref.abs().max()
        assert (lin(x) - ref).abs().max() <= tol, rows
    x = torch.randn(2, 3, 24)
    assert lin(x).shape == (2, 3, 40)
    emb = QuantEmbedding.from_float(w)
    ids = torch.tensor([[0, 39, 7]])
    assert torch.allclose(emb(ids), F.embedding(ids, lin.weight))


@pytest.mark.skipif(not kernel_library.available(), reason="no C compiler: the int8 kernel is not built")
def test_quant_linear_takes_the_int8_kernel_up_to_64_rows_and_packs_no_copy(monkeypatch):
    """Up to DYNAMIC_ROWS rows: linlm's int8 kernel (counted), in one call, with no fbgemm packed copy made; each
    row's outputs equal the same row's alone (a scale per row); where the kernel does not take the input, fbgemm,
    whose packed weight is made on that call. Both within the rounding of the input (fbgemm's in 7 bits)."""
    torch.manual_seed(3)
    lin = QuantLinear.from_float(torch.randn(300, 96))
    calls = []
    real = quant.q8_linear
    monkeypatch.setattr(quant, "q8_linear", lambda *a: calls.append(a[0].shape) or real(*a))
    x = torch.randn(DYNAMIC_ROWS, 96)
    ref = x @ lin.weight.T
    with torch.no_grad():
        small = lin(x[:8])
        big = lin(x)
        assert calls == [(8, 96), (DYNAMIC_ROWS, 96)] and lin._packed is None
        assert torch.equal(big[:8], small) and torch.equal(big[-1:], lin(x[-1:]))
        monkeypatch.setattr(quant, "q8_linear_takes", lambda *a: False)
        fallback = lin(x[:12])
        assert len(calls) == 3 and lin._packed is not None
    for got, want in ((big, ref), (fallback, ref[:12])):
        assert (got - want).abs().max() <= 0.02 * want.abs().max()


def test_longer_inputs_dequantise_the_weight_a_block_of_rows_at_a_time(monkeypatch):
    """Blocks of 16 rows of a 40-row weight (two full, one short): x (q s)^T within float32 summation's bound of
    the float64 product, for 65 and 200 rows."""
    monkeypatch.setattr(quant, "DEQUANT_ROWS", 16)
    torch.manual_seed(4)
    lin = QuantLinear.from_float(torch.randn(40, 24))
    w = lin.weight.double()
    for rows in (65, 200):
        x = torch.randn(rows, 24)
        with torch.no_grad():
            got = lin(x)
        exact = x.double() @ w.T
        bound = (24 + 2) * 2.0**-24 * (x.double().abs() @ w.abs().T)
        assert got.shape == (rows, 40) and ((got.double() - exact).abs() <= bound).all(), rows


def test_an_int8_weight_of_minus_128_is_refused():
    lin = QuantLinear(4, 2)
    q = torch.tensor([[1, 2, 3, -128], [0, 0, 0, 0]], dtype=torch.int8)
    with pytest.raises(CheckpointError, match="-128"):
        lin.set_int8(q, torch.ones(2))


@pytest.mark.parametrize("arch", arch_names())
def test_every_architecture_quantizes_saves_and_loads(arch, tmp_path):
    model = _tiny(arch)
    model.save(tmp_path / "fp32")
    assert main(["quantize", str(tmp_path / "fp32"), "--to", "int8", "--out", str(tmp_path / "int8")]) == 0
    q = load(tmp_path / "int8").eval()
    assert q.quantization["method"] == "int8"
    assert any(isinstance(m, QuantLinear) for m in q.modules())
    assert not any(type(m) is torch.nn.Linear and m.bias is None for m in q.modules())
    weights = (tmp_path / "int8" / "model.safetensors").stat().st_size
    assert weights < (0.6 if arch != "mossnet" else 0.9) * (tmp_path / "fp32" / "model.safetensors").stat().st_size
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full, ref = q(ids), model(ids)
        logits, state = q.prefill(ids[:, :6])
        for t in range(6, 12):
            logits, state = q.step(ids[:, t], state)
    assert torch.isfinite(full).all() and torch.isfinite(logits).all()
    # int8 weights move the logits a little, not a lot, and decoding agrees with the full pass within that
    assert (full - ref).norm() < 0.15 * ref.norm()
    assert (logits - full[:, -1]).norm() < 0.15 * full[:, -1].norm()
    # saved again, the quantized model keeps its int8 weights bit for bit
    q.save(tmp_path / "again")
    again = load(tmp_path / "again")
    assert all(torch.equal(a, b) for a, b in zip(q.state_dict().values(), again.state_dict().values()))


@pytest.mark.skipif(not kernel_library.available(), reason="no C compiler: the int8 kernel is not built")
@pytest.mark.parametrize("batch", [1, 3])
def test_an_int8_prefill_goes_in_pieces_of_int8_products(batch, monkeypatch):
    """An int8 model's prefill runs pieces of DYNAMIC_ROWS // B tokens (a float model's: PREFILL_CHUNK), so that
    every product is an int8 one of at most DYNAMIC_ROWS rows, never the dequantised weight's; its logits equal the
    same pieces asked for by name, and agree with the full pass within the int8 steps' error."""
    from linlm.models.lm import PREFILL_CHUNK
    from linlm.models.quant import prefill_tokens, quantize_model

    model = _tiny("mamba")
    q = quantize_model(_tiny("mamba"))
    assert prefill_tokens(model, batch) is None
    assert prefill_tokens(q, batch) == DYNAMIC_ROWS // batch and prefill_tokens(q, 65) == 1
    rows = []
    real = quant.q8_linear
    monkeypatch.setattr(quant, "q8_linear", lambda *a: rows.append(a[0].shape[0]) or real(*a))

    def no_dequantised_product(self, x2):
        raise AssertionError(f"a prefill's product of {x2.shape[0]} rows took the dequantised weight")

    monkeypatch.setattr(QuantLinear, "_dequantised_product", no_dequantised_product)
    ids = torch.randint(0, 64, (batch, 150), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, state = q.prefill(ids)
        assert max(rows) == DYNAMIC_ROWS // batch * batch
        named, _ = q.prefill(ids, chunk=DYNAMIC_ROWS // batch)
        assert torch.equal(logits, named)
        monkeypatch.undo()
        full = q(ids)[:, -1]
        assert torch.equal(model.prefill(ids)[0], model.prefill(ids, chunk=PREFILL_CHUNK)[0])
    assert (logits - full).norm() < 0.02 * full.norm()


def _text_ids(n, vocab, seed):
    """A learnable sequence: a noisy order-1 Markov chain over the vocabulary."""
    g = torch.Generator().manual_seed(0)
    table = torch.randint(0, vocab, (vocab, 2), generator=g)
    g = torch.Generator().manual_seed(seed)
    ids = [0]
    for _ in range(n - 1):
        ids.append(int(table[ids[-1], int(torch.randint(0, 2, (1,), generator=g))]))
    return torch.tensor([ids])


def _nll_full(model, ids):
    with torch.no_grad():
        return F.cross_entropy(model(ids[:, :-1])[0], ids[0, 1:]).item()


def _nll_steps(model, ids):
    with torch.no_grad():
        logits, state = model.prefill(ids[:, :1])
        total = F.cross_entropy(logits, ids[:, 1])
        for t in range(1, ids.shape[1] - 1):
            logits, state = model.step(ids[:, t], state)
            total = total + F.cross_entropy(logits, ids[:, t + 1])
    return total.item() / (ids.shape[1] - 1)


@pytest.mark.parametrize("arch", ["mamba", "hgrn2"])
def test_trained_model_keeps_its_perplexity_within_one_percent(arch, tmp_path):
    from linlm.models.quant import quantize_model

    torch.manual_seed(0)
    model = create_model(arch, preset="tiny", vocab_size=32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train = _text_ids(2049, 32, seed=1)
    for i in range(60):
        x = train[:, (i * 97) % 1024:][:, :257]
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[0, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    held_out = _text_ids(129, 32, seed=2)
    ppl = math.exp(_nll_full(model, held_out))
    assert ppl < 16, "the tiny model did not learn: the comparison would say nothing"
    model.save(tmp_path / "fp32")
    q = quantize_model(load(tmp_path / "fp32").eval())
    for nll in (_nll_full, _nll_steps):  # the dequantized-weight path and the int8 GEMM of decoding steps
        ratio = math.exp(nll(q, held_out)) / math.exp(nll(model, held_out))
        assert abs(ratio - 1) < 0.01, (nll.__name__, ratio)


def test_quantizing_twice_or_a_non_model_is_one_line(tmp_path, capsys):
    _tiny("mamba").save(tmp_path / "fp32")
    assert main(["quantize", str(tmp_path / "fp32"), "--to", "int8", "--out", str(tmp_path / "int8")]) == 0
    capsys.readouterr()
    assert main(["quantize", str(tmp_path / "int8"), "--to", "int8", "--out", str(tmp_path / "twice")]) == 2
    err = capsys.readouterr().err
    assert "already quantized" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "twice").exists()
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "rwkv"}')
    assert main(["quantize", str(tmp_path / "hf"), "--to", "int8", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "not a linlm model" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
