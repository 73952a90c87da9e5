import json

import pytest

from linlm.cli import main
from linlm.models.counting import count_preset

# Non-embedding parameters in millions, arXiv 2406.16690 (LLaMA / TNL / HGRN2 / cosFormer2).
PAPER_PARAMS = {
    "paper-70m": (20.5, 21.2, 20.5, 21.3),
    "paper-160m": (85.0, 87.3, 84.9, 87.5),
    "paper-410m": (334.1, 327.7, 334.0, 328.0),
    "paper-1b": (906.2, 918.6, 906.0, 919.1),
    "paper-3b": (2775.8, 2798.4, 2775.5, 2799.0),
    "paper-7b": (6476.5, 6509.6, 6476.1, 6511.0),
}
ARCHS = ("llama", "tnl", "hgrn2", "cosformer2")
# PFLOPs per step at b = 480, n = 8192, as printed by the paper.
PAPER_PFLOPS = {"paper-70m": (1.6, 0.5, 0.5, 0.5), "paper-7b": (202.7, 154.4, 153.6, 155.6)}


@pytest.mark.parametrize("preset", list(PAPER_PARAMS))
@pytest.mark.parametrize("i", range(4))
def test_non_embedding_params_match_paper(preset, i):
    arch = ARCHS[i]
    got = count_preset(arch, preset)["non_embedding_params"] / 1e6
    want = PAPER_PARAMS[preset][i]
    assert abs(got - want) / want < 0.005, f"{arch} {preset}: {got:.2f}M vs paper {want}M"


@pytest.mark.parametrize("preset", list(PAPER_PFLOPS))
@pytest.mark.parametrize("i", range(4))
def test_flops_per_step_match_paper(preset, i):
    got = count_preset(ARCHS[i], preset)["flops_per_step"] / 1e15
    assert round(got, 1) == PAPER_PFLOPS[preset][i]


def test_counted_flops_close_to_paper_linear_terms():
    # 6N from the layer shapes must agree with the paper's leading 72 b n l d^2 term (= 6 x 12 l d^2 per token)
    # up to the GLU width, which the paper's formula idealises as 8/3 d.
    c = count_preset("llama", "paper-7b", batch=1, seq_len=8192)
    linear_only = c["flops_per_token"] - 3 * 32 * 2 * 8193 * 4096  # minus causal attention
    assert abs(linear_only - 6 * c["non_embedding_params"]) / linear_only < 0.01


def test_count_cli_json(capsys):
    assert main(["count", "--arch", "tnl", "--preset", "paper-70m", "--batch", "2", "--seq-len", "128", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("non_embedding_params", "total_params", "flops_per_step", "flops_per_token"):
        assert key in data
    assert data["total_params"] == data["non_embedding_params"] + 100_280 * 512
    assert data["batch"] == 2 and data["seq_len"] == 128
