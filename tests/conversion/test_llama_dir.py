"""Llama-family checkpoint directories convert through linlm.convert as through from_hf_llama, and back."""

import pytest
import torch

import linlm

transformers = pytest.importorskip("transformers")


def test_hf_llama_directory_converts_and_back(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.05)
    hf.save_pretrained(tmp_path / "hf")
    linlm.convert(tmp_path / "hf", tmp_path / "ours")
    ours = linlm.load(tmp_path / "ours").eval()
    assert ours.config.kv_heads == 2 and not ours.config.tie_embeddings
    ids = torch.randint(0, 64, (2, 21))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=0, atol=1e-5)
    linlm.convert(tmp_path / "ours", tmp_path / "back", to="hf-llama")
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, hf(ids).logits, rtol=0, atol=1e-5)


def test_the_old_import_path_still_converts():
    from linlm.conversion.hf_llama import from_hf_llama as new
    from linlm.hf.llama import from_hf_llama as old

    assert old is new


def test_a_sharded_checkpoint_is_read_shard_by_shard(tmp_path):
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                   num_attention_heads=4)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "hf").glob("model-*.safetensors"))) > 1
    linlm.convert(tmp_path / "hf", tmp_path / "ours")
    ids = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(linlm.load(tmp_path / "ours")(ids), hf(ids).logits, rtol=0, atol=1e-5)
