"""Models saved while Mamba's, MossNet's and LLaMA's settings were flat ModelConfig fields load and compute what
they computed.

tests/models/data/saved_v2/ was written by linlm at commit b6b411a (the last with those 21 flat fields): tiny models
of every architecture, with non-default settings where the fields mattered (grouped-query attention and llama3 RoPE
scaling, Mamba's d_state, d_conv, expand and dt_rank, MossNet's experts, policy and kernel), every weight perturbed
so that no default initialisation hides a misread setting; saved by ``model.save`` and, for three of them, by
transformers' ``save_pretrained``. ``expected.safetensors`` holds their logits and auxiliary losses on ``ids`` then.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import linlm
from linlm.models.archs.llama import LlamaOptions
from linlm.models.archs.mamba import MambaOptions
from linlm.models.archs.mossnet import MossNetOptions
from linlm.models.model_config import ModelConfig
from linlm.models.registry import ARCHITECTURES

SAVED = Path(__file__).parent / "data" / "saved_v2"
EXPECTED = load_file(str(SAVED / "expected.safetensors"))
IDS = load_file(str(SAVED / "ids.safetensors"))["ids"]
NAMES = sorted({k.split(".")[0] for k in EXPECTED})
# Computed on another CPU than this one, possibly: float32 rounding, nothing more.
ATOL = 1e-6


def _check(model, name: str) -> None:
    with torch.no_grad():
        out = model.eval()(IDS, return_aux=True)
    torch.testing.assert_close(out.logits, EXPECTED[f"{name}.logits"], rtol=0, atol=ATOL)
    torch.testing.assert_close(out.aux_loss.reshape(1), EXPECTED[f"{name}.aux"], rtol=0, atol=ATOL)


def test_the_fixtures_hold_the_flat_fields():
    flat = json.loads((SAVED / "mossnet_ssd" / "config.json").read_text())["config"]
    assert flat["options"] == {} and flat["ssm_kernel"] == "ssd" and flat["n_kv_heads"] == 0
    assert len(NAMES) == 7


@pytest.mark.parametrize("name", NAMES)
def test_a_saved_model_of_the_flat_format_loads_with_its_logits(name):
    model = linlm.load(SAVED / name)
    _check(model, name)
    # Saved again, it is written in today's format (nested options only) and reads back to the same config.
    data = model.config.to_dict()
    assert not set(data) & {"d_state", "ssm_experts", "n_kv_heads", "rope_scaling"}
    assert ModelConfig.from_saved(data) == model.config


def test_the_settings_land_in_the_options():
    assert linlm.load(SAVED / "llama").config.options == LlamaOptions(
        rope_theta=5e5, n_kv_heads=2, rope_scaling="llama3", rope_factor=4.0, rope_low_freq_factor=1.5,
        rope_high_freq_factor=3.0, rope_original_max_len=16)
    assert linlm.load(SAVED / "mamba").config.options == MambaOptions(d_state=4, d_conv=3, expand=3, dt_rank=3)
    ssd = linlm.load(SAVED / "mossnet_ssd").config
    assert ssd.options == MossNetOptions(d_state=4, d_conv=3, expand=2, dt_rank=2, ssm_experts=3, ssm_top_k=2,
                                         mlp_experts=3, mlp_top_k=1, mlp_expert_dim=8, shared_experts=1,
                                         ssm_policy="routed", ssm_kernel="ssd", balance_loss_coef=0.02,
                                         router_z_loss_coef=0.001)
    # The earlier attribute spellings still read.
    assert (ssd.d_state, ssd.ssm_kernel, ssd.shared_experts) == (4, "ssd", 1)
    assert linlm.load(SAVED / "llama").config.n_kv_heads == 2
    with pytest.raises(AttributeError):
        ssd.n_kv_heads  # LLaMA's, not MossNet's


@pytest.mark.parametrize("name", ["llama_hf", "mamba_hf", "mossnet_ssd_hf"])
def test_a_transformers_save_of_the_flat_format_loads_with_its_logits(name):
    transformers = pytest.importorskip("transformers")
    import linlm.hf  # noqa: F401  (registers the classes)

    back = transformers.AutoModelForCausalLM.from_pretrained(SAVED / name)
    _check(back.model, name.removesuffix("_hf"))
    assert back.model.config == linlm.load(SAVED / name.removesuffix("_hf")).config


def test_a_flat_train_config_still_means_what_it_meant(tmp_path):
    from linlm.train.config_sources import load_train_config

    flat = tmp_path / "flat.yaml"
    flat.write_text("model:\n  arch: mossnet\n  preset: tiny\n  overrides:\n    ssm_kernel: ssd\n    d_state: 8\n"
                    "    mlp_top_k: 1\n")
    nested = tmp_path / "nested.yaml"
    nested.write_text("model:\n  arch: mossnet\n  preset: tiny\n  overrides:\n"
                      "    options: {ssm_kernel: ssd, d_state: 8, mlp_top_k: 1}\n")
    a = load_train_config(flat, []).model_config()
    b = load_train_config(nested, ["model.overrides.options.ssm_top_k=1"]).model_config()
    assert a.options.ssm_kernel == "ssd" and a.options.d_state == 8 and a.options.mlp_experts == 4  # the preset's
    assert b == a.replace(options={"ssm_top_k": 1})
    assert "mossnet" in ARCHITECTURES
