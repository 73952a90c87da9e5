"""generate() of a linlm transformers model refuses sampling settings out of range, by linlm's own checks, before
the model runs."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from linlm import create_model  # noqa: E402
from linlm.errors import ConfigError  # noqa: E402
from linlm.hf.modeling import to_hf  # noqa: E402


@pytest.fixture
def hf():
    torch.manual_seed(0)
    model = to_hf(create_model("hgrn2", preset="tiny").eval())
    calls = []
    model.model.register_forward_pre_hook(lambda *a: calls.append(1))
    model.calls = calls
    return model


@pytest.mark.parametrize("settings,message", [
    (dict(do_sample=True, top_p=0.0), r"^top_p: must be in \(0, 1\]"),
    (dict(do_sample=True, top_p=1.5), r"^top_p: must be in \(0, 1\]"),
    (dict(do_sample=False, top_p=0.0), r"^top_p: must be in \(0, 1\]"),
    (dict(do_sample=True, temperature=0.0), r"^temperature: must be > 0 when do_sample=True"),
    (dict(do_sample=True, temperature=-0.5), r"^temperature: must be a finite number >= 0"),
    (dict(do_sample=True, temperature=float("nan")), r"^temperature: must be a finite number >= 0"),
    (dict(do_sample=True, top_k=-1), r"^top_k: must be >= 0"),
])
def test_out_of_range_sampling_is_refused_before_generation(hf, settings, message):
    with pytest.raises(ConfigError, match=message):
        hf.generate(torch.ones(1, 4, dtype=torch.long), max_new_tokens=3, pad_token_id=0, **settings)
    assert hf.calls == []


def test_the_settings_of_a_generation_config_are_checked(hf):
    ids = torch.ones(1, 4, dtype=torch.long)
    config = transformers.GenerationConfig(do_sample=True, top_p=0.5, max_new_tokens=3, pad_token_id=0)
    config.top_p = 0.0
    with pytest.raises(ConfigError, match=r"^top_p: must be in \(0, 1\]"):
        hf.generate(ids, generation_config=config)
    hf.generation_config.top_k = -2  # the model's own defaults
    with pytest.raises(ConfigError, match=r"^top_k: must be >= 0"):
        hf.generate(ids, max_new_tokens=3, pad_token_id=0)
    assert hf.calls == []


def test_settings_in_range_generate(hf):
    out = hf.generate(torch.ones(1, 4, dtype=torch.long), max_new_tokens=3, do_sample=True, top_p=1.0, top_k=0,
                      temperature=0.7, pad_token_id=0)
    assert out.shape == (1, 7) and len(hf.calls) == 3
