import pytest
import torch

transformers = pytest.importorskip("transformers")

from linlm import create_model  # noqa: E402
from linlm.hf.llama import from_hf_llama, hf_config_from, to_hf_llama  # noqa: E402


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


def test_linlm_to_hf_and_back_is_exact():
    torch.manual_seed(1)
    ours = create_model("llama", preset="tiny").eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.05)
    hf = to_hf_llama(ours).eval()
    ids = torch.randint(0, ours.config.vocab_size, (1, 40))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids), rtol=0, atol=1e-5)
    back = from_hf_llama(hf)
    for name, value in ours.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name


def test_layernorm_llama_is_refused():
    from linlm.errors import ConfigError

    ours = create_model("llama", preset="tiny", norm_type="layer")
    with pytest.raises(ConfigError, match="norm_type"):
        to_hf_llama(ours)
