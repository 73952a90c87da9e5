"""transformers' Qwen3NextForCausalLM (dense or sparse MLPs) -> linlm's gated_deltanet, its full-attention layers a
hybrid's attention layers: the converted model's logits equal the source's (1e-5, both in float64: in float32 the two
chunked delta-rule algorithms round apart by up to 1.3e-5 on an AVX2 CPU), decoding from linlm's state
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
    # the released models' MLPs: a router over 6 experts, top 2 renormalised, and a gated shared expert of its own
    # width, in every layer (the attention layer's too)
    "sparse": dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
                   num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                   layer_types=["linear_attention", "full_attention", "linear_attention"], head_dim=24),
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
    hf.config._experts_implementation = "eager"  # its grouped-matmul experts take no float64
    hf, ours = hf.double(), ours.double()
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
    ("hidden_act", "gelu", "hidden_act: 'gelu' is not supported"),
    ("linear_num_value_heads", 3, "linear_num_value_heads: 3 is not a multiple of linear_num_key_heads=2"),
])
def test_settings_linlm_cannot_compute_are_refused_naming_the_field(tmp_path, capsys, field, value, needle):
    random_hf_qwen3_next(**LAYOUTS["hybrid"]).save_pretrained(tmp_path / "hf")
    assert_refused(tmp_path / "hf", tmp_path, capsys, field, value, needle)


@pytest.mark.parametrize("field, value, needle", [
    ("mlp_only_layers", [1], "num_experts: 6 makes layers [0, 2] sparse mixtures of experts and layers [1] dense"),
    ("decoder_sparse_step", 2, "makes layers [1] sparse mixtures of experts and layers [0, 2] dense"),
    ("norm_topk_prob", False, "norm_topk_prob: false weights the chosen experts by their raw softmax"),
])
def test_sparse_settings_linlm_cannot_compute_are_refused_naming_the_field(tmp_path, capsys, field, value, needle):
    random_hf_qwen3_next(**LAYOUTS["sparse"]).save_pretrained(tmp_path / "hf")
    assert_refused(tmp_path / "hf", tmp_path, capsys, field, value, needle)


def test_experts_fused_as_transformers_holds_them_convert_as_the_released_files(tmp_path):
    """save_pretrained writes the released files' layout, one experts.{e}.gate_proj / up_proj / down_proj per
    expert; transformers' modules (and a state_dict saved from them) hold them fused, experts.gate_up_proj
    [E, 2h, d] and experts.down_proj [E, d, h]. Both give the same linlm model, and its routed MLP is a mixture:
    its active parameters are below its total."""
    from safetensors.torch import load_file, save_file

    hf = random_hf_qwen3_next(**LAYOUTS["sparse"])
    hf.save_pretrained(tmp_path / "hf")
    linlm.convert(tmp_path / "hf", tmp_path / "a")
    [path] = (tmp_path / "hf").glob("*.safetensors")
    tensors, fused = load_file(path), {}
    for name, t in tensors.items():
        base, _, rest = name.partition(".experts.")
        if not rest:
            fused[name] = t
        elif rest.startswith("0."):
            e = [f"{base}.experts.{i}." for i in range(6)]
            fused[base + ".experts.gate_up_proj"] = torch.stack(
                [torch.cat([tensors[x + "gate_proj.weight"], tensors[x + "up_proj.weight"]]) for x in e])
            fused[base + ".experts.down_proj"] = torch.stack([tensors[x + "down_proj.weight"] for x in e])
    assert len(fused) < len(tensors) and any(k.endswith("experts.gate_up_proj") for k in fused)
    path.unlink()
    save_file({k: v.contiguous() for k, v in fused.items()}, str(path), metadata={"format": "pt"})
    linlm.convert(tmp_path / "hf", tmp_path / "b")
    a, b = linlm.load(tmp_path / "a"), linlm.load(tmp_path / "b")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    from linlm.models.counting import count

    counts = count(a.config, batch=1, seq_len=16)
    assert counts["active_non_embedding_params"] < counts["non_embedding_params"]


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
