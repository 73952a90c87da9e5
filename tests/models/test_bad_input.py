import subprocess
import sys

import pytest
import torch

from linlm import create_model
from linlm.cli import main
from linlm.errors import ConfigError, ShapeError


def test_unknown_arch_names_choices():
    with pytest.raises(ConfigError, match=r"arch.*'gpt5'.*valid choices.*'hgrn2'.*'llama'"):
        create_model("gpt5")


def test_unknown_preset_names_choices():
    with pytest.raises(ConfigError, match=r"preset.*'paper-9b'.*paper-70m"):
        create_model("llama", preset="paper-9b")


def test_width_not_divisible_by_heads():
    with pytest.raises(ConfigError, match=r"d_model: 100 is not divisible by n_heads=3"):
        create_model("tnl", preset="tiny", d_model=100, n_heads=3)


@pytest.mark.parametrize("key", ["d_model", "n_layers", "n_heads", "vocab_size"])
@pytest.mark.parametrize("value", [0, -4])
def test_non_positive_sizes(key, value):
    with pytest.raises(ConfigError, match=key):
        create_model("hgrn2", preset="tiny", **{key: value})


def test_unknown_override_key():
    with pytest.raises(ConfigError, match=r"unknown key 'd_modle'.*'d_model'"):
        create_model("llama", preset="tiny", d_modle=3)


def test_wrong_type():
    with pytest.raises(ConfigError, match=r"n_layers: expected an integer"):
        create_model("llama", preset="tiny", n_layers="many")


@pytest.mark.parametrize("arch", ["llama", "cosformer2"])
def test_ids_outside_vocab(arch):
    model = create_model(arch, preset="tiny", vocab_size=100)
    with pytest.raises(ShapeError, match=r"token id 100.*vocab_size=100"):
        model(torch.tensor([[1, 2, 100]]))


def test_input_longer_than_limit():
    model = create_model("llama", preset="tiny", max_seq_len=16)
    with pytest.raises(ShapeError, match=r"17 tokens.*max_seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_cli_error_exits_2_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "linlm", "count", "--arch", "nope", "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "unknown architecture 'nope'" in proc.stderr and "'llama'" in proc.stderr


def test_cli_bad_override_exits_2(capsys):
    assert main(["count", "--arch", "tnl", "--preset", "tiny", "--set", "d_model=65", "--json"]) == 2
    assert "d_model: 65 is not divisible by n_heads=2" in capsys.readouterr().err


def test_unknown_norm_type_is_refused():
    with pytest.raises(ConfigError, match="norm_type: unknown norm 'batch'; valid choices are 'auto', 'layer'"):
        create_model("llama", preset="tiny", norm_type="batch")
    with pytest.raises(ConfigError, match="tnl_slopes: unknown rule 'linear'"):
        create_model("tnl", preset="tiny", tnl_slopes="linear")
