"""transformers' Qwen3NextForCausalLM (dense MLPs) -> linlm's gated_deltanet, its full-attention layers a hybrid's
attention layers: the converted model's logits equal the source's (float32, 1e-5), decoding from linlm's state
continues them, and settings linlm cannot compute are refused naming the field."""

import pytest
import torch

import linlm
from hf_random import assert_refused, perturbed, token_ids

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen3NextForCausalLM"):
    pytest.skip("this transformers has no Qwen3-Next", allow_module_level=True)

LAYOUTS = {
    # value heads grouped over key heads (Qwen3-Next's own allocation), V != K
    "grouped_values": dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                           linear_value_head_dim=12, num_experts=0),
    # one value head a key head, a tied head, a shorter conv, MoE switched off layer by layer
    "tied_dense_layers": dict(linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
                              linear_value_head_dim=16, linear_conv_kernel_dim=3, tie_word_embeddings=True,
                              num_experts=4, mlp_only_layers=[0, 1, 2]),
    # Qwen3-Next's own pattern: gated attention (GQA, q/k norms, partial RoPE, heads wider than d / H) between
    # linear layers
    "hybrid": dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
                   num_experts=0, head_dim=24, layer_types=["linear_attention", "full_attention", "linear_attention"],
                   rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}),
}


def random_hf_qwen3_next(seed=0, vocab=97, layers=3, **layout):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3NextConfig(**{**dict(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6, layer_types=["linear_attention"] * layers), **layout})
    return perturbed(transformers.Qwen3NextForCausalLM(cfg))  # the (1 + w) norms away from 1 too


def _ids(vocab=97, T=29):
    return token_ids(vocab, T)


@pytest.mark.parametrize("name", LAYOUTS)
def test_hf_qwen3_next_converts_with_equal_logits(tmp_path, name):
    hf = random_hf_qwen3_next(**LAYOUTS[name])
    hf.save_pretrained(tmp_path / "hf")
    linlm.convert(tmp_path / "hf", tmp_path / "ours")
    ours = linlm.load(tmp_path / "ours").eval()
    c = hf.config
    assert ours.config.arch == "gated_deltanet" and ours.config.tie_embeddings == c.tie_word_embeddings
    assert ours.config.n_heads == c.linear_num_key_heads and ours.config.options.v_heads == c.linear_num_value_heads
    assert list(ours.config.attention_layers) == [i for i, t in enumerate(c.layer_types) if t == "full_attention"]
    ids = _ids()
    with torch.no_grad():
        want = hf(ids, use_cache=False).logits  # (its cache needs an attention layer to build a mask)
        torch.testing.assert_close(ours(ids), want, rtol=0, atol=1e-5)
        logits, state = ours.prefill(ids[:, :20])  # decoding from linlm's state continues what transformers computes
        for t in range(20, 28):
            logits, state = ours.step(ids[:, t], state)
        torch.testing.assert_close(logits, want[:, 27], rtol=0, atol=1e-5)


@pytest.mark.parametrize("field, value, needle", [
    ("layer_types", ["linear_attention", "sliding_attention", "linear_attention"],
     "layer_types: layers [1] are 'sliding_attention'"),
    ("attention_bias", True, "attention_bias: Qwen3-Next attention with biases is not supported"),
    ("num_attention_heads", 4, "num_attention_heads: 4 attention heads against linear_num_key_heads=2"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0},
     "rope_parameters: rope_type 'yarn' rescales RoPE"),
    ("num_experts", 4, "num_experts: 4 makes layers [0, 1, 2] sparse mixtures of experts"),
    ("hidden_act", "gelu", "hidden_act: 'gelu' is not supported"),
    ("linear_num_value_heads", 3, "linear_num_value_heads: 3 is not a multiple of linear_num_key_heads=2"),
])
def test_settings_linlm_cannot_compute_are_refused_naming_the_field(tmp_path, capsys, field, value, needle):
    random_hf_qwen3_next(**LAYOUTS["hybrid"]).save_pretrained(tmp_path / "hf")
    assert_refused(tmp_path / "hf", tmp_path, capsys, field, value, needle)


# Qwen3.5: the same layers with separate linear-layer projections, a multimodal RoPE (plain for text), and its
# language model also inside Qwen3_5ForConditionalGeneration.
QWEN35_TEXT = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=24, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=8, linear_value_head_dim=12,
                   layer_types=["linear_attention", "full_attention", "linear_attention"],
                   rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5,
                                    "mrope_section": [2, 2, 2], "mrope_interleaved": True})
needs_qwen35 = pytest.mark.skipif(not hasattr(transformers, "Qwen3_5ForConditionalGeneration"),
                                  reason="this transformers has no Qwen3.5")


def _converted(hf, tmp_path):
    hf.save_pretrained(tmp_path / "hf")
    linlm.convert(tmp_path / "hf", tmp_path / "ours")
    return linlm.load(tmp_path / "ours").eval()


@needs_qwen35
def test_hf_qwen35_text_model_converts_with_equal_logits(tmp_path):
    torch.manual_seed(0)
    hf = perturbed(transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**QWEN35_TEXT)))
    ours = _converted(hf, tmp_path)
    assert list(ours.config.attention_layers) == [1] and ours.config.options.v_heads == 4
    ids = _ids()
    with torch.no_grad():
        want = hf(ids).logits
        torch.testing.assert_close(ours(ids), want, rtol=0, atol=1e-5)
        logits, state = ours.prefill(ids[:, :20])
        for t in range(20, 28):
            logits, state = ours.step(ids[:, t], state)
        torch.testing.assert_close(logits, want[:, 27], rtol=0, atol=1e-5)


@needs_qwen35
def test_the_language_model_of_qwen35_for_conditional_generation_converts(tmp_path):
    """The multimodal checkpoint: its text_config and model.language_model.* tensors convert, its vision tower is
    left out, and on text the converted model computes what the whole model does."""
    torch.manual_seed(1)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=2,
                  temporal_patch_size=1, spatial_merge_size=1)
    hf = perturbed(transformers.Qwen3_5ForConditionalGeneration(
        transformers.Qwen3_5Config(text_config=QWEN35_TEXT, vision_config=vision)))
    assert any(n.startswith("model.visual.") for n in hf.state_dict())
    ours = _converted(hf, tmp_path)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(input_ids=ids).logits, rtol=0, atol=1e-5)
