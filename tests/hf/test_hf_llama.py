import pytest
import torch

transformers = pytest.importorskip("transformers")

from linlm import create_model  # noqa: E402
from linlm.hf.llama import from_hf_llama, hf_config_from, to_hf_llama  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same torch seed, as the model and layer tests do."""
    torch.manual_seed(0)


def test_random_hf_llama_and_converted_twin_agree():
    torch.manual_seed(0)
    ours = create_model("llama", preset="tiny", rope_theta=5000.0)
    hf = transformers.LlamaForCausalLM(hf_config_from(ours.config)).eval()
    # Random, asymmetric weights everywhere, norms included, so a swapped tensor shows up.
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.05)
    twin = from_hf_llama(hf).eval()
    ids = torch.randint(0, ours.config.vocab_size, (2, 29))
    with torch.no_grad():
        want = hf(ids).logits
        got = twin(ids)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


# Real Llama-family layouts: (n_kv_heads, tie_embeddings, rope scaling).
LAYOUTS = {
    "full_heads_tied": dict(),
    "smollm_gqa_tied": dict(n_kv_heads=1, tie_embeddings=True),
    "tinyllama_gqa_untied": dict(n_kv_heads=2, tie_embeddings=False),
    "llama2_full_untied": dict(n_kv_heads=0, tie_embeddings=False),
    "llama3_gqa_untied_scaled": dict(n_kv_heads=2, tie_embeddings=False, rope_scaling="llama3", rope_factor=8.0,
                                     rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_len=64),
    # heads wider than d_model / n_heads (transformers' head_dim; Qwen3's and Gemma's checkpoints)
    "wide_heads_gqa_untied": dict(n_kv_heads=2, tie_embeddings=False, options={"head_dim": 24}),
}


def _layout_model(**layout):
    return create_model("llama", preset="tiny", n_heads=4, rope_theta=5000.0, **layout)


@pytest.mark.parametrize("name", LAYOUTS)
def test_real_layouts_convert_from_hf(name):
    torch.manual_seed(2)
    cfg = _layout_model(**LAYOUTS[name]).config
    hf = transformers.LlamaForCausalLM(hf_config_from(cfg)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.05)
    assert (hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()) == cfg.tie_embeddings
    twin = from_hf_llama(hf).eval()
    assert twin.config.kv_heads == hf.config.num_key_value_heads
    assert twin.config.tie_embeddings == cfg.tie_embeddings and twin.config.rope_scaling == cfg.rope_scaling
    # Positions past rope_original_max_len, where llama3 scaling changes the low frequencies.
    ids = torch.randint(0, cfg.vocab_size, (2, 90))
    with torch.no_grad():
        torch.testing.assert_close(twin(ids), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", LAYOUTS)
def test_real_layouts_convert_to_hf_and_back(name):
    torch.manual_seed(3)
    ours = _layout_model(**LAYOUTS[name]).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.05)
    hf = to_hf_llama(ours).eval()
    ids = torch.randint(0, ours.config.vocab_size, (1, 80))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids), rtol=0, atol=1e-5)
    back = from_hf_llama(hf)
    assert back.config.replace(chunk_size=ours.config.chunk_size) == ours.config  # chunk_size is not LLaMA's
    for name_, value in ours.state_dict().items():
        assert torch.equal(back.state_dict()[name_], value), name_


def test_llama3_scaling_changes_logits():
    """The scaled frequencies are used (the conversion test would pass with both sides unscaled otherwise)."""
    torch.manual_seed(4)
    scaled = _layout_model(**LAYOUTS["llama3_gqa_untied_scaled"]).eval()
    plain = _layout_model(**{**LAYOUTS["llama3_gqa_untied_scaled"], "rope_scaling": "none"}).eval()
    plain.load_state_dict(scaled.state_dict())
    ids = torch.randint(0, 512, (1, 90))
    with torch.no_grad():
        assert (scaled(ids) - plain(ids)).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["yarn", "linear", "dynamic"])
def test_other_rope_scalings_are_refused(kind):
    from linlm.errors import CheckpointError

    cfg = hf_config_from(_layout_model().config)
    cfg.rope_parameters = {"rope_type": kind, "rope_theta": 10000.0, "factor": 2.0}
    with pytest.raises(CheckpointError, match=rf"RoPE scaling '{kind}' is not supported.*llama3"):
        from linlm.hf.llama import config_from_hf

        config_from_hf(cfg)


def test_paper_presets_keep_full_heads_and_tied_head():
    model_cfg = create_model("llama", preset="tiny").config
    assert model_cfg.kv_heads == model_cfg.n_heads and model_cfg.tie_embeddings and model_cfg.rope_scaling == "none"
    from linlm.models.presets import preset_config

    for preset in ("paper-70m", "paper-1b"):
        cfg = preset_config("llama", preset)
        assert cfg.n_kv_heads == 0 and cfg.tie_embeddings and cfg.rope_scaling == "none"


def test_layernorm_llama_is_refused():
    from linlm.errors import ConfigError

    ours = create_model("llama", preset="tiny", norm_type="layer")
    with pytest.raises(ConfigError, match="norm_type"):
        to_hf_llama(ours)


@pytest.mark.parametrize("option, value", [("qk_norm", True), ("output_gate", True), ("rope_fraction", 0.5)])
def test_attention_variants_llama_lacks_do_not_convert_to_it(option, value):
    from linlm.errors import ConfigError

    ours = create_model("llama", preset="tiny", options={option: value})
    with pytest.raises(ConfigError, match=rf"^options.{option}: LlamaForCausalLM has no such variant"):
        to_hf_llama(ours)

