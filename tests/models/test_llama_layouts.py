"""LLaMA's real-checkpoint layouts (grouped-query attention, untied head, llama3 RoPE scaling) keep the model-level
invariants, save and load, and are validated."""

import json

import pytest
import torch

from linlm import create_model, load
from linlm.errors import ConfigError

LAYOUT = dict(n_heads=4, n_kv_heads=2, tie_embeddings=False, rope_scaling="llama3", rope_original_max_len=32)


def model_with(**kw):
    m = create_model("llama", preset="tiny", **kw).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # asymmetric norms and heads
    return m


@pytest.mark.parametrize("prompt_len", [1, 30])
def test_gqa_untied_prefill_then_decode_matches_full_pass(prompt_len):
    model = model_with(**LAYOUT)
    ids = torch.randint(0, 512, (2, 45))
    with torch.no_grad():
        full = model(ids)
        logits, state = model.prefill(ids[:, :prompt_len])
        pieces = [model(ids[:, :prompt_len])]
        for t in range(prompt_len, ids.shape[1]):
            step, state = model.step(ids[:, t], state)
            pieces.append(step[:, None])
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-4, atol=1e-5)


def test_gqa_packed_batch_matches_documents():
    model = model_with(**LAYOUT)
    docs = [torch.randint(0, 512, (1, n)) for n in (17, 1, 30)]
    reset = torch.zeros(1, 48, dtype=torch.bool)
    reset[0, [0, 17, 18]] = True
    with torch.no_grad():
        torch.testing.assert_close(model(torch.cat(docs, 1), reset=reset), torch.cat([model(d) for d in docs], 1),
                                   rtol=1e-4, atol=1e-5)


def test_gqa_kv_cache_holds_only_kv_heads():
    full = model_with(n_heads=4)
    gqa = model_with(n_heads=4, n_kv_heads=1)
    ids = torch.randint(0, 512, (1, 20))
    assert gqa.prefill(ids)[1].nbytes() * 4 == full.prefill(ids)[1].nbytes()
    assert gqa.num_parameters() < full.num_parameters()


def test_untied_head_is_its_own_weight_and_trains():
    model = model_with(tie_embeddings=False)
    assert model.head is not None and model.head.weight.data_ptr() != model.embed.weight.data_ptr()
    ids = torch.randint(0, 512, (2, 9))
    model(ids, targets=ids.roll(-1, 1)).loss.backward()
    assert model.head.weight.grad.abs().sum() > 0
    assert model.num_parameters(non_embedding=True) == model.num_parameters() - 2 * 512 * 64


def test_layouts_save_and_load(tmp_path):
    model = model_with(**LAYOUT)
    model.save(tmp_path / "m")
    back = load(tmp_path / "m")
    assert back.config == model.config
    ids = torch.randint(0, 512, (1, 40))
    with torch.no_grad():
        torch.testing.assert_close(back(ids), model(ids), rtol=0, atol=0)


def test_checkpoint_without_the_new_fields_loads_as_before(tmp_path):
    model = model_with()
    model.save(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    del meta["config"]["tie_embeddings"]
    for key in ("n_kv_heads", "rope_scaling", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                "rope_original_max_len"):  # LLaMA's options since they left the flat fields
        del meta["config"]["options"][key]
    meta["format_version"] = 1  # written before config checksums existed
    meta.pop("config_sha256", None)
    (tmp_path / "m" / "config.json").write_text(json.dumps(meta))
    back = load(tmp_path / "m")
    assert back.head is None and back.config.kv_heads == back.config.n_heads
    ids = torch.randint(0, 512, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(back(ids), model(ids), rtol=0, atol=0)


@pytest.mark.parametrize("kw, match", [
    (dict(n_heads=4, n_kv_heads=3), r"n_kv_heads: 3 must divide n_heads=4.*\[1, 2, 4\]"),
    (dict(n_kv_heads=-1), r"n_kv_heads: -1 must divide"),
    (dict(rope_scaling="yarn"), r"rope_scaling: unknown scaling 'yarn'.*'llama3'"),
    (dict(rope_scaling="llama3", rope_low_freq_factor=4.0, rope_high_freq_factor=1.0), r"0 < low < high"),
])
def test_bad_layouts_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        create_model("llama", preset="tiny", **kw)


def test_gqa_only_for_llama():
    with pytest.raises(ConfigError, match=r"n_kv_heads: grouped-query attention exists only for arch 'llama'"):
        create_model("tnl", preset="tiny", n_heads=4, n_kv_heads=2)
