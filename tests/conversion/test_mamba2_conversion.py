"""transformers' Mamba2ForCausalLM <-> linlm Mamba-2: the converted models' logits equal the source's (float32,
1e-5), through `linlm convert` both ways; settings linlm cannot compute are refused naming the field."""

import pytest
import torch

import linlm
from linlm.errors import ConfigError
from hf_random import assert_refused, perturbed, token_ids

transformers = pytest.importorskip("transformers")

from linlm.conversion.hf_mamba2 import from_hf_mamba2, to_hf_mamba2  # noqa: E402

LAYOUTS = {
    "groups2_untied": dict(n_groups=2, num_heads=4, head_dim=16),
    "tied_one_group": dict(n_groups=1, num_heads=2, head_dim=32, tie_word_embeddings=True),
    "no_conv_bias_k3": dict(n_groups=2, num_heads=8, head_dim=8, use_conv_bias=False, conv_kernel=3, state_size=4),
}


def random_hf_mamba2(seed=0, vocab=97, **layout):
    torch.manual_seed(seed)
    cfg = transformers.Mamba2Config(**{**dict(vocab_size=vocab, hidden_size=32, state_size=8, num_hidden_layers=2,
                                              expand=2, layer_norm_epsilon=1e-5, chunk_size=8), **layout})
    return perturbed(transformers.Mamba2ForCausalLM(cfg))


def _ids(vocab=97, T=29):
    return token_ids(vocab, T)


@pytest.mark.parametrize("name", LAYOUTS)
def test_hf_mamba2_directory_converts_and_back(tmp_path, name):
    hf = random_hf_mamba2(**LAYOUTS[name])
    hf.save_pretrained(tmp_path / "hf")
    linlm.convert(tmp_path / "hf", tmp_path / "ours")
    ours = linlm.load(tmp_path / "ours").eval()
    assert ours.config.arch == "mamba2" and ours.config.tie_embeddings == hf.config.tie_word_embeddings
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=0, atol=1e-5)
        # Decoding from linlm's state continues what transformers computes.
        logits, state = ours.prefill(ids[:, :20])
        for t in range(20, 28):
            logits, state = ours.step(ids[:, t], state)
        torch.testing.assert_close(logits, hf(ids).logits[:, 27], rtol=0, atol=1e-5)
    linlm.convert(tmp_path / "ours", tmp_path / "hf2", to="hf-mamba2")
    back = transformers.Mamba2ForCausalLM.from_pretrained(tmp_path / "hf2").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, hf(ids).logits, rtol=0, atol=1e-5)


def test_to_hf_mamba2_and_back_keeps_every_tensor():
    ours = from_hf_mamba2(random_hf_mamba2(seed=3, **LAYOUTS["groups2_untied"]))
    again = from_hf_mamba2(to_hf_mamba2(ours))
    for (n, a), (_, b) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


@pytest.mark.parametrize("field, value, needle", [
    ("use_bias", True, "use_bias: Mamba-2 checkpoints with in_proj/out_proj biases are not supported"),
    ("hidden_act", "gelu", "hidden_act: 'gelu' is not supported"),
    ("time_step_limit", [0.0, 0.1], "time_step_limit: (0.0, 0.1) clamps dt"),
    ("num_heads", 3, "num_heads: 3 heads of head_dim=16 do not fill the inner width"),
])
def test_settings_linlm_cannot_compute_are_refused_naming_the_field(tmp_path, capsys, field, value, needle):
    random_hf_mamba2(**LAYOUTS["groups2_untied"]).save_pretrained(tmp_path / "hf")
    assert_refused(tmp_path / "hf", tmp_path, capsys, field, value, needle)


def test_a_hybrid_does_not_convert_to_mamba2forcausallm(tmp_path):
    model = linlm.create_model("mamba2", preset="tiny", attn_layers=[1])
    with pytest.raises(ConfigError, match=r"attn_layers: Mamba2ForCausalLM has no attention layers"):
        to_hf_mamba2(model)
    with pytest.raises(ConfigError, match=r"attn_layers: Mamba2ForCausalLM has no attention layers"):
        linlm.convert(_saved(model, tmp_path), tmp_path / "hf", to="hf-mamba2")
    assert not (tmp_path / "hf").exists()


def _saved(model, tmp_path):
    model.save(tmp_path / "hybrid")
    return tmp_path / "hybrid"
