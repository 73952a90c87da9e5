"""The two model-level invariants, for every registered architecture: prefill plus decoding equals one full pass,
and a packed batch equals its documents run one by one."""

import pytest
import torch

from linlm import create_model
from linlm.errors import ShapeError
from linlm.models.registry import ARCHITECTURES

ARCHS = sorted(ARCHITECTURES)


def tiny(arch, **kw):
    return create_model(arch, preset="tiny", **kw).eval()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prompt_len", [1, 19, 40])
def test_prefill_then_decode_matches_full_pass(arch, prompt_len):
    model = tiny(arch)
    ids = torch.randint(0, model.config.vocab_size, (2, 53))
    with torch.no_grad():
        full = model(ids)
        out = model(ids[:, :prompt_len], return_state=True)
        pieces, state = [out.logits], out.state
        for t in range(prompt_len, ids.shape[1]):
            step = model(ids[:, t : t + 1], state=state, return_state=True)
            pieces.append(step.logits)
            state = step.state
    inc = torch.cat(pieces, dim=1)
    assert torch.isfinite(inc).all()
    torch.testing.assert_close(inc, full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_in_two_chunks_matches_full_pass(arch):
    model = tiny(arch)
    ids = torch.randint(0, model.config.vocab_size, (1, 70))
    with torch.no_grad():
        full = model(ids)
        a = model(ids[:, :33], return_state=True)
        b = model(ids[:, 33:], state=a.state, return_state=True)
    torch.testing.assert_close(torch.cat([a.logits, b.logits], 1), full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", [a for a in ARCHS if ARCHITECTURES[a].constant_state])
def test_decoding_state_is_constant_size(arch):
    model = tiny(arch)
    sizes = []
    for n in (5, 200):
        with torch.no_grad():
            out = model(torch.randint(0, 512, (1, n)), return_state=True)
        sizes.append(out.state.nbytes())
    assert sizes[0] == sizes[1] > 0


def test_llama_kv_cache_grows_with_context():
    model = tiny("llama")
    with torch.no_grad():
        s5 = model(torch.randint(0, 512, (1, 5)), return_state=True).state.nbytes()
        s9 = model(torch.randint(0, 512, (1, 9)), return_state=True).state.nbytes()
    cfg = model.config
    assert s9 - s5 == 4 * 2 * cfg.n_layers * cfg.d_model * 4  # 2 x layers x d floats per token


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_batch_matches_documents_run_one_by_one(arch):
    model = tiny(arch)
    lengths = [23, 1, 41]
    docs = [torch.randint(0, model.config.vocab_size, (1, n)) for n in lengths]
    packed = torch.cat(docs, dim=1)
    reset = torch.zeros_like(packed, dtype=torch.bool)
    start = 0
    for n in lengths:
        reset[0, start] = True
        start += n
    with torch.no_grad():
        got = model(packed, reset=reset)
        want = torch.cat([model(d) for d in docs], dim=1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_gradients_reach_every_parameter(arch):
    model = create_model(arch, preset="tiny")
    ids = torch.randint(0, model.config.vocab_size, (2, 37))
    out = model(ids, return_aux=True)
    loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), ids.flatten()) + out.aux_loss
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"{name} gets no gradient"


@pytest.mark.parametrize("arch", ARCHS)
def test_loss_from_targets_matches_cross_entropy_of_logits(arch):
    """The training path (targets=, chunked fused head + loss) gives the loss and gradients of the logits path."""
    model = tiny(arch).double().train()
    ids = torch.randint(0, model.config.vocab_size, (2, 37))
    targets = ids.roll(-1, dims=1)
    targets[0, -1] = targets[1, 5] = -100
    out = model(ids, targets=targets, return_aux=True)
    assert out.logits is None
    ref_out = model(ids, return_aux=True)
    ref = torch.nn.functional.cross_entropy(ref_out.logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(out.loss, ref, rtol=1e-10, atol=1e-12)
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(out.loss + out.aux_loss, params)
    want = torch.autograd.grad(ref + ref_out.aux_loss, params)
    for (name, _), a, b in zip(model.named_parameters(), got, want):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-11, msg=name)


def test_targets_are_checked():
    model = tiny("llama")
    ids = torch.randint(0, 512, (1, 8))
    with pytest.raises(ShapeError, match="targets must have the shape"):
        model(ids, targets=ids[:, :4])
    with pytest.raises(ShapeError, match=r"targets holds token id 512.*ignore_index=-100"):
        model(ids, targets=torch.full_like(ids, 512))
