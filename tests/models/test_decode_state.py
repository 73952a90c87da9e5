"""A decoding state knows the model that made it, and degenerate inputs get clear errors."""

import pytest
import torch

from linlm import create_model
from linlm.errors import ShapeError
from linlm.layers.state import ModelState
from linlm.models.registry import ARCHITECTURES


def tiny(arch, **kw):
    return create_model(arch, preset="tiny", **kw).eval()


def test_state_from_another_architecture_is_refused_naming_both():
    ids = torch.randint(0, 512, (1, 6))
    _, state = tiny("tnl").prefill(ids)
    with pytest.raises(ShapeError, match=r"another model \(arch='tnl'\) than this one \(arch='hgrn2'\)"):
        tiny("hgrn2").step(ids[:, 0], state)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_state_from_a_deeper_model_is_refused(arch):
    ids = torch.randint(0, 512, (1, 6))
    _, state = tiny(arch, n_layers=3).prefill(ids)
    with pytest.raises(ShapeError, match=r"n_layers=3\) than this one \(n_layers=1\)"):
        tiny(arch, n_layers=1).step(ids[:, 0], state)


def test_hand_built_state_is_checked_by_layer_count():
    ids = torch.randint(0, 512, (1, 6))
    _, state = tiny("tnl", n_layers=3).prefill(ids)
    bare = ModelState(state.layers, state.offset, state.extra)  # no signature
    with pytest.raises(ShapeError, match=r"state holds 3 layers, this tnl model has n_layers=1"):
        tiny("tnl", n_layers=1).step(ids[:, 0], bare)


@pytest.mark.parametrize("arch", ["llama", "mamba"])
def test_state_for_another_batch_size_is_refused(arch):
    model = tiny(arch)
    _, state = model.prefill(torch.randint(0, 512, (3, 6)))
    with pytest.raises(ShapeError, match=r"batch of 3 sequences, input_ids have 2"):
        model.step(torch.tensor([1, 2]), state)


def test_state_from_another_width_is_refused():
    _, state = tiny("hgrn2").prefill(torch.randint(0, 512, (1, 4)))
    with pytest.raises(ShapeError, match=r"d_model=64.*d_model=128"):
        tiny("hgrn2", d_model=128).step(torch.tensor([1]), state)


def test_same_shaped_model_accepts_the_state():
    """A state moves between models of one config (e.g. a copy on another device); vocab and limits may differ."""
    ids = torch.randint(0, 512, (2, 7))
    a = tiny("tnl")
    b = tiny("tnl", max_seq_len=4096)
    b.load_state_dict(a.state_dict())
    _, sa = a.prefill(ids)
    torch.testing.assert_close(b.step(ids[:, 0], sa)[0], a.step(ids[:, 0], sa)[0])


@pytest.mark.parametrize("bad", [{}, [], (None, None)])
def test_state_that_is_not_a_model_state(bad):
    with pytest.raises(ShapeError, match=r"state must be the ModelState returned by .*got (dict|list|tuple)"):
        tiny("hgrn2")(torch.tensor([[1, 2]]), state=bad)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("shape", [(1, 0), (0, 3)])
def test_empty_inputs_are_refused(arch, shape):
    model = tiny(arch)
    with pytest.raises(ShapeError, match=r"hold no tokens"):
        model.prefill(torch.zeros(shape, dtype=torch.long))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_non_integer_targets_are_refused(dtype):
    ids = torch.randint(0, 512, (1, 5))
    with pytest.raises(ShapeError, match=r"targets must be integer token ids.*" + str(dtype).split(".")[1]):
        tiny("llama")(ids, targets=ids.to(dtype))


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_decoding_after_a_packed_prefill_continues_the_last_document(arch):
    """Rows of different packing (one is left padding + a prompt) decode like their last document run alone."""
    model = tiny(arch)
    a, b, pad = torch.randint(0, 512, (1, 9)), torch.randint(0, 512, (1, 5)), torch.full((1, 4), 7)
    ids = torch.cat([a, torch.cat([pad, b], 1)], 0)
    reset = torch.zeros(2, 9, dtype=torch.bool)
    reset[:, 0] = True
    reset[1, 4] = True
    nxt = torch.randint(0, 512, (2, 3))
    with torch.no_grad():
        state = model(ids, reset=reset, return_state=True).state
        got = []
        for t in range(3):
            logits, state = model.step(nxt[:, t], state)
            got.append(logits)
        for row, doc in enumerate((a, b)):
            want = model(torch.cat([doc, nxt[row : row + 1]], 1))[0, -3:]
            torch.testing.assert_close(torch.stack(got, 1)[row], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "cosformer2"])
def test_logits_to_keep_and_prefill_compute_only_the_last_positions(arch):
    model = tiny(arch, tie_embeddings=False)
    ids = torch.randint(0, 512, (2, 17))
    with torch.no_grad():
        full = model(ids)
        torch.testing.assert_close(model(ids, logits_to_keep=3), full[:, -3:], rtol=0, atol=1e-6)
        last, _ = model.prefill(ids)
    assert last.shape == (2, 512)
    torch.testing.assert_close(last, full[:, -1], rtol=0, atol=1e-6)


def test_kv_cache_grows_in_place_and_a_state_stays_unchanged_when_extended_twice():
    from linlm.layers.attention import append_kv

    torch.manual_seed(0)
    model = tiny("llama", max_seq_len=512)
    ids = torch.randint(0, 512, (2, 300))
    steps, ptrs = [], []
    with torch.no_grad():
        full = model(ids)
    # Decode token by token from the prefill: the logits match the full pass, and the cache moves rarely.
    with torch.no_grad():
        _, state = model.prefill(ids[:, :20])
        for t in range(20, 300):
            logits, state = model.step(ids[:, t], state)
            steps.append(logits)
            ptrs.append(state.layers[0][0].data_ptr())
        assert torch.allclose(torch.stack(steps, 1), full[:, 20:300], atol=1e-5)
        assert len(set(ptrs)) <= 12  # reallocated about every 25 % of growth, not at every token
        # Two continuations of one prefix: the second finds the buffer already extended, copies, and both are right.
        _, prefix = model.prefill(ids[:, :50])
        a, _ = model.step(ids[:, 50], prefix)
        b, _ = model.step(ids[:, 51], prefix)
        ref_b = model(torch.cat([ids[:, :50], ids[:, 51:52]], 1))[:, -1]
        assert torch.allclose(a, full[:, 50], atol=1e-5) and torch.allclose(b, ref_b, atol=1e-5)
    # The op on its own: values as torch.cat, and under autograd plain torch.cat.
    c = torch.randn(1, 2, 5, 4)
    n = torch.randn(1, 2, 3, 4)
    grown = append_kv(c, n)
    assert torch.equal(grown, torch.cat([c, n], 2)) and grown._base is not None
    again = append_kv(grown, n)
    assert again.data_ptr() == grown.data_ptr() and torch.equal(again[:, :, :8], grown)
    fork = append_kv(grown, 2 * n)  # grown was already extended: a copy, `again` is untouched
    assert fork.data_ptr() != grown.data_ptr() and torch.equal(again[:, :, 8:], n)
    assert torch.equal(fork, torch.cat([c, n, 2 * n], 2))
    needs_grad = c.clone().requires_grad_()
    assert append_kv(needs_grad, n)._base is None


@pytest.mark.parametrize("rope_scaling", ["none", "llama3"])
def test_rope_angle_table_equals_the_angles_computed_per_call(rope_scaling):
    """The attention layer slices its angles from a table that grows by doubling; every slice must equal, bit for
    bit, what rope_angles computes for those positions, across growths and dtypes."""
    from linlm.ops.fused import rope_angles

    model = create_model("llama", preset="tiny", rope_scaling=rope_scaling)
    attn = model.layers[0].mixer
    inv = None if attn.inv_freq is None else attn.inv_freq
    for offset, T, dtype in ((0, 5, torch.float32), (250, 10, torch.float32), (1000, 300, torch.float32),
                             (3, 1, torch.bfloat16), (700, 2, torch.float32)):
        cos, sin = attn._angles(offset, T, torch.device("cpu"), dtype)
        ref = rope_angles(torch.arange(T) + offset, attn.head_dim, attn.rope_theta, dtype, inv_freq=inv)
        assert cos.dtype == dtype and torch.equal(cos, ref[0]) and torch.equal(sin, ref[1]), (offset, T, dtype)
    assert attn._rope_table[2].shape[0] == 2048  # the power of two past 1300, kept through the later rebuilds
