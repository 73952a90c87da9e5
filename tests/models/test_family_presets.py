"""Mamba-2, GLA and RetNet at the paper's sizes: LLaMA's non-embedding parameters within 2 %, at LLaMA's width."""

import pytest
import torch

from linlm import create_model
from linlm.layers.mamba2 import mamba2_dims
from linlm.models.presets import PRESETS, preset_config

PAPER = [p for p in PRESETS if p.startswith("paper-")]


@pytest.mark.parametrize("preset", PAPER)
@pytest.mark.parametrize("arch", ["mamba2", "gla", "retnet"])
def test_paper_presets_match_llama_within_2_percent(arch, preset):
    with torch.device("meta"):
        llama = create_model("llama", preset).num_parameters(non_embedding=True)
        model = create_model(arch, preset)
    cfg = preset_config(arch, preset)
    assert cfg.d_model == PRESETS[preset]["d_model"]
    assert abs(model.num_parameters(non_embedding=True) / llama - 1) < 0.02
    if arch == "mamba2":
        assert cfg.options.d_state % 16 == 0 and mamba2_dims(cfg)[2] == 64 and cfg.options.expand == 2
    if arch == "gla":
        assert cfg.n_layers == PRESETS[preset]["n_layers"] and cfg.glu_dim == PRESETS[preset]["glu_dim"]
