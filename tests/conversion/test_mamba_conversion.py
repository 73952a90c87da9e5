"""transformers' MambaForCausalLM <-> linlm Mamba, and mamba_ssm's MambaLMHeadModel layout -> linlm Mamba: the
converted models' logits equal the source's (float32, 1e-5)."""

import json

import pytest
import torch
from safetensors.torch import save_file

import linlm
from linlm.errors import CheckpointError

from hf_random import perturbed, token_ids

transformers = pytest.importorskip("transformers")

from linlm.conversion.hf_llama import config_from_hf, from_hf_llama  # noqa: E402
from linlm.conversion.hf_mamba import from_hf_mamba, to_hf_mamba  # noqa: E402

LAYOUTS = {
    "tied": dict(),
    "untied_rank_3": dict(tie_word_embeddings=False, time_step_rank=3),
    "no_conv_bias_k3_expand3": dict(use_conv_bias=False, conv_kernel=3, expand=3, state_size=4),
}


def random_hf_mamba(seed=0, vocab=104, **layout):
    torch.manual_seed(seed)
    cfg = transformers.MambaConfig(**{**dict(vocab_size=vocab, hidden_size=32, state_size=8, num_hidden_layers=2,
                                             layer_norm_epsilon=1e-5), **layout})
    return perturbed(transformers.MambaForCausalLM(cfg))


def _ids(vocab, T=37):
    return token_ids(vocab, T)


@pytest.mark.parametrize("name", LAYOUTS)
def test_hf_mamba_directory_converts_and_computes_the_same(tmp_path, name):
    hf = random_hf_mamba(**LAYOUTS[name])
    hf.save_pretrained(tmp_path / "hf")
    linlm.convert(tmp_path / "hf", tmp_path / "ours")
    ours = linlm.load(tmp_path / "ours").eval()
    assert ours.config.tie_embeddings == hf.config.tie_word_embeddings
    ids = _ids(104)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", LAYOUTS)
def test_linlm_mamba_converts_to_a_directory_transformers_loads(tmp_path, name):
    hf = random_hf_mamba(seed=1, **LAYOUTS[name])
    ours = from_hf_mamba(hf)
    ours.save(tmp_path / "ours")
    linlm.convert(tmp_path / "ours", tmp_path / "hf", to="hf-mamba")
    back = transformers.MambaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = _ids(104)
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, ours(ids), rtol=0, atol=1e-5)
    assert (back.lm_head.weight.data_ptr() == back.backbone.embeddings.weight.data_ptr()) == \
        ours.config.tie_embeddings


def test_to_hf_mamba_and_back_keeps_every_tensor():
    ours = from_hf_mamba(random_hf_mamba(seed=2, tie_word_embeddings=False))
    again = from_hf_mamba(to_hf_mamba(ours))
    assert again.config == ours.config
    for name, value in ours.state_dict().items():
        assert torch.equal(again.state_dict()[name], value), name


def test_each_converter_refuses_a_checkpoint_of_another_architecture():
    mamba = random_hf_mamba()
    with pytest.raises(CheckpointError, match=r"describes a transformers 'mamba' checkpoint.*not a 'llama' one"):
        from_hf_llama(mamba)
    with pytest.raises(CheckpointError, match=r"describes a transformers 'mamba' checkpoint.*not a 'llama' one"):
        config_from_hf(mamba.config)  # a MambaConfig: an AttributeError before
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4))
    with pytest.raises(CheckpointError, match=r"describes a transformers 'llama' checkpoint.*not a 'mamba' one"):
        from_hf_mamba(llama)


# ---- mamba_ssm's MambaLMHeadModel layout


def write_mamba_ssm(directory, hf, vocab_size, pad=8, fmt="bin", **extra):
    """A checkpoint in mamba_ssm's layout with the weights of ``hf``: its config.json keys and tensor names."""
    directory.mkdir()
    c = hf.config
    config = dict(d_model=c.hidden_size, n_layer=c.num_hidden_layers, vocab_size=vocab_size,
                  ssm_cfg=dict(d_state=c.state_size, d_conv=c.conv_kernel, expand=c.expand, dt_rank=c.time_step_rank,
                               conv_bias=c.use_conv_bias),
                  rms_norm=True, residual_in_fp32=True, fused_add_norm=True, pad_vocab_size_multiple=pad,
                  tie_embeddings=c.tie_word_embeddings, **extra)
    (directory / "config.json").write_text(json.dumps(config))
    sd = {k.replace("backbone.embeddings.", "backbone.embedding."): v.clone().contiguous()
          for k, v in hf.state_dict().items()}
    if fmt == "bin":
        torch.save(sd, directory / "pytorch_model.bin")
    else:
        sd.pop("lm_head.weight") if c.tie_word_embeddings else None
        save_file(sd, str(directory / "model.safetensors"))
    return directory


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
@pytest.mark.parametrize("name", ["tied", "untied_rank_3"])
def test_mamba_ssm_checkpoint_converts_with_its_padded_vocabulary(tmp_path, fmt, name):
    hf = random_hf_mamba(seed=3, vocab=104, **LAYOUTS[name])  # 99 tokens padded to a multiple of 8
    src = write_mamba_ssm(tmp_path / "ssm", hf, vocab_size=99, fmt=fmt)
    linlm.convert(src, tmp_path / "ours")
    ours = linlm.load(tmp_path / "ours").eval()
    assert ours.config.vocab_size == 104 and ours.config.norm_eps == 1e-5
    ids = _ids(99)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("extra,match", [
    (dict(ssm_cfg={"layer": "Mamba2"}), r"^ssm_cfg.layer: 'Mamba2' blocks are not supported"),
    (dict(attn_layer_idx=[1]), r"^attn_layer_idx: hybrid checkpoints"),
    (dict(d_intermediate=64), r"^d_intermediate: "),
])
def test_mamba_ssm_checkpoints_linlm_cannot_build_are_refused(tmp_path, extra, match):
    src = write_mamba_ssm(tmp_path / "ssm", random_hf_mamba(), vocab_size=104)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **extra}))
    with pytest.raises(CheckpointError, match=match):
        linlm.convert(src, tmp_path / "ours")
    assert not (tmp_path / "ours").exists()


def test_mamba_ssm_embeddings_of_another_padded_size_are_refused(tmp_path):
    src = write_mamba_ssm(tmp_path / "ssm", random_hf_mamba(vocab=104), vocab_size=99, pad=16)
    with pytest.raises(CheckpointError, match=r"embeddings have 104 rows; .* padded to a multiple of 16 is 112"):
        linlm.convert(src, tmp_path / "ours")


def test_mamba_ssm_layer_norm_checkpoint_converts_with_norm_type_layer(tmp_path):
    hf = random_hf_mamba(seed=4)
    with torch.no_grad():  # rms_norm=False: mamba_ssm's blocks and final norm are LayerNorms with a bias
        for owner, attr in [*((layer, "norm") for layer in hf.backbone.layers), (hf.backbone, "norm_f")]:
            norm = torch.nn.LayerNorm(32, eps=1e-5)
            norm.weight.normal_(1.0, 0.1)
            norm.bias.normal_(0.0, 0.1)
            setattr(owner, attr, norm)
    src = write_mamba_ssm(tmp_path / "ssm", hf, vocab_size=104)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "rms_norm": False}))
    linlm.convert(src, tmp_path / "ours")
    ours = linlm.load(tmp_path / "ours").eval()
    assert ours.config.norm_type == "layer"
    ids = _ids(104)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=0, atol=1e-5)
