"""Mamba-2, GLA and RetNet at the paper's sizes: LLaMA's non-embedding parameters within 2 %, at LLaMA's width."""

import pytest
import torch

from linlm import create_model
from linlm.layers.mamba2 import mamba2_dims
from linlm.models.counting import count, count_preset
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


# (architecture, preset, pattern) for hybrids: the architectures whose preset rule solves a setting, the rest
# (HGRN2, GLA: blocks of LLaMA's size already), at depths the pattern fits.
HYBRIDS = [(arch, preset, pattern)
           for arch in ["mamba2", "mamba", "retnet", "gated_deltanet", "deltanet", "mossnet", "hgrn2", "gla"]
           for preset in ["paper-70m", "paper-410m", "paper-7b"]
           for pattern in [dict(attn_every=4), dict(attn_every=8), dict(attn_layers=[3, 5])]
           if not (preset == "paper-70m" and pattern.get("attn_every") == 8 and arch not in ("mamba2", "mamba"))]


@pytest.mark.parametrize("arch, preset, pattern", HYBRIDS)
def test_hybrid_paper_presets_match_llama_within_2_percent(arch, preset, pattern):
    """A hybrid's attention layers are LLaMA blocks: without matching again, Mamba-2 7:1 at paper-70m held 8 %
    more than LLaMA (and 1:3 held 25 % more), Gated DeltaNet 1:3 at paper-7b 4 % less."""
    llama = count_preset("llama", preset)["active_non_embedding_params"]
    pure, hybrid = preset_config(arch, preset), preset_config(arch, preset, **pattern)
    assert hybrid.attention_layers and hybrid.d_model == pure.d_model
    assert abs(count(hybrid)["active_non_embedding_params"] / llama - 1) < 0.02
    if arch not in ("mamba2", "mamba"):
        assert hybrid.n_layers == pure.n_layers  # only the rules that pick a depth change it


def test_a_hybrid_preset_keeps_what_the_caller_sets():
    pure = preset_config("mamba2", "paper-70m")
    assert preset_config("mamba2", "paper-70m", attn_every=8).n_layers == 11  # 10 Mamba-2 blocks and 1 LLaMA block
    assert preset_config("mamba2", "paper-70m", attn_every=8, n_layers=12).n_layers == 12
    fixed_state = preset_config("mamba2", "paper-70m", attn_every=8, options={"d_state": 64})
    assert fixed_state.options.d_state == 64 and fixed_state.n_layers == pure.n_layers
    assert preset_config("gated_deltanet", "paper-70m", attn_every=4, glu_dim=1000).glu_dim == 1000
    flat = preset_config("mamba", "paper-70m", attn_every=4, dt_rank=8)  # Mamba's flat spelling of options.dt_rank
    assert flat.options.dt_rank == 8 and flat.n_layers == preset_config("mamba", "paper-70m").n_layers
    tiny = preset_config("mamba2", "tiny", attn_every=2)  # only the paper rows are matched
    assert tiny.n_layers == PRESETS["tiny"]["n_layers"]
