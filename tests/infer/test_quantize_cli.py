"""A quantized model works in the commands that load a model, as it is."""

from __future__ import annotations

import pytest
import torch

from linlm.cli import main

pytestmark = pytest.mark.skipif(
    not {"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines), reason="no fbgemm int8 kernels")


def test_generate_and_perplexity_take_a_quantized_model(model_dir, tmp_path, capsys):
    out = tmp_path / "int8"
    assert main(["quantize", str(model_dir), "--to", "int8", "--out", str(out)]) == 0
    assert (out / "tokenizer.json").is_file()  # the tokenizer travels with the weights
    capsys.readouterr()
    args = ["--prompt", "the king and", "--max-new-tokens", "6", "--temperature", "0"]
    assert main(["generate", "--model", str(out), *args]) == 0
    int8 = capsys.readouterr().out
    assert int8.startswith("the king and") and len(int8) > len("the king and\n")
    text = tmp_path / "held_out.txt"
    text.write_text("the king and queen of a land far away ride north to meet their old friend at dawn\n" * 3)
    for model in (model_dir, out):
        assert main(["perplexity", "--model", str(model), "--source", str(text)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("perplexity") >= 2, printed
