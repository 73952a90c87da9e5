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


def test_quantizing_a_model_onto_itself_is_refused_and_keeps_the_float_weights(model_dir, tmp_path, capsys):
    """--out MODEL --overwrite replaced the float weights by their int8 copy: the float model was lost, and it is
    the only thing a quantization can be made from again."""
    import shutil

    from output_asserts import one_line_error, snapshot

    src = tmp_path / "float"
    shutil.copytree(model_dir, src)
    before = snapshot(src)
    for out in (src, tmp_path / "." / "float"):
        assert main(["quantize", str(src), "--to", "int8", "--out", str(out), "--overwrite"]) == 2
        one_line_error(capsys.readouterr().err, f"--out {out}: is the model being quantized", "would be replaced by "
                       "the int8 copy and lost", "Give a new directory")
    assert snapshot(src) == before
    # without --overwrite, an existing model at --out names the command's flag, not the Python argument
    assert main(["quantize", str(src), "--to", "int8", "--out", str(tmp_path / "q")]) == 0
    assert main(["quantize", str(src), "--to", "int8", "--out", str(tmp_path / "q")]) == 2
    one_line_error(capsys.readouterr().err, "holds a saved model already", "--overwrite")
