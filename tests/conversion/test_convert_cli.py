"""``linlm convert``: detection, the outputs rules (never over a user's file; --overwrite), the tokenizer files, and
bad input: one line, exit 2, nothing written."""

import datetime
import json

import pytest
import torch
from safetensors.torch import save_file

import linlm
from linlm.cli import main
from linlm.errors import CheckpointError

import fla_reference as fla
from output_asserts import one_line_error, snapshot

CONFIG = dict(model_type="hgrn2", hidden_size=32, num_hidden_layers=2, num_heads=4, expand_ratio=8, vocab_size=61)
TOKENIZER = {"tokenizer.json": '{"model": {"type": "BPE"}}', "tokenizer_config.json": '{"model_max_length": 64}',
             "special_tokens_map.json": '{"eos_token": "</s>"}'}


def fla_dir(path, config=CONFIG, sd=None):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    save_file(fla.random_state(config) if sd is None else sd, str(path / "model.safetensors"))
    return path


def refused(capsys, tmp_path, argv, *needles):
    before = snapshot(tmp_path)
    assert main(["convert", *argv]) == 2
    line = one_line_error(capsys.readouterr().err, *needles)
    assert snapshot(tmp_path) == before  # nothing written, nothing changed
    return line


def test_convert_detects_the_layout_copies_the_tokenizer_and_keeps_a_users_files(tmp_path, capsys):
    src = fla_dir(tmp_path / "fla")
    for name, text in TOKENIZER.items():
        (src / name).write_text(text)
    assert main(["convert", str(src), "--out", str(tmp_path / "ours")]) == 0
    assert "wrote" in capsys.readouterr().out
    for name, text in TOKENIZER.items():
        assert (tmp_path / "ours" / name).read_text() == text
    assert linlm.load(tmp_path / "ours").config.arch == "hgrn2"
    refused(capsys, tmp_path, [str(src), "--out", str(tmp_path / "ours")], "holds a saved model already")
    assert main(["convert", str(src), "--out", str(tmp_path / "ours"), "--from", "fla-hgrn2", "--overwrite"]) == 0
    capsys.readouterr()
    (tmp_path / "ours" / "notes.txt").write_text("mine")
    refused(capsys, tmp_path, [str(src), "--out", str(tmp_path / "ours"), "--overwrite"], "notes.txt")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.txt").write_text("mine")
    refused(capsys, tmp_path, [str(src), "--out", str(tmp_path / "mine")], "not a saved linlm model")


def test_a_directory_that_is_not_a_checkpoint(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("hello")
    refused(capsys, tmp_path, [str(tmp_path / "notes"), "--out", str(tmp_path / "o")], "holds no config.json")
    refused(capsys, tmp_path, [str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")], "does not exist")


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_a_truncated_weight_file(tmp_path, capsys, fmt):
    src = fla_dir(tmp_path / "fla")
    if fmt == "bin":
        torch.save(fla.random_state(CONFIG), src / "pytorch_model.bin")
        (src / "model.safetensors").unlink()
    weights = src / ("model.safetensors" if fmt == "safetensors" else "pytorch_model.bin")
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    refused(capsys, tmp_path, [str(src), "--out", str(tmp_path / "o")], weights.name, "truncated or corrupt")


def test_a_config_without_weights(tmp_path, capsys):
    src = fla_dir(tmp_path / "fla")
    (src / "model.safetensors").unlink()
    refused(capsys, tmp_path, [str(src), "--out", str(tmp_path / "o")], "has a config.json but no weights")


def test_weights_of_another_size(tmp_path, capsys):
    small = {**CONFIG, "hidden_size": 16, "expand_ratio": 4}
    src = fla_dir(tmp_path / "fla", config=CONFIG, sd=fla.random_state(small))
    refused(capsys, tmp_path, [str(src), "--out", str(tmp_path / "o")], "has shape", "the config needs")


def test_a_pickle_holding_more_than_tensors_is_never_run(tmp_path, capsys):
    src = fla_dir(tmp_path / "fla")
    (src / "model.safetensors").unlink()
    torch.save({**fla.random_state(CONFIG), "when": datetime.datetime(2024, 1, 1)}, src / "pytorch_model.bin")
    refused(capsys, tmp_path, [str(src), "--out", str(tmp_path / "o")], "holds more than tensors", "weights_only")


def test_an_unknown_layout_or_another_architecture_names_what_was_found(tmp_path, capsys):
    src = fla_dir(tmp_path / "gpt2", config={"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, sd={})
    refused(capsys, tmp_path, [str(src), "--out", str(tmp_path / "o")],
            "describes a transformers 'gpt2' checkpoint (GPT2LMHeadModel), which linlm cannot convert", "hf-mamba")
    hgrn2 = fla_dir(tmp_path / "fla")
    refused(capsys, tmp_path, [str(hgrn2), "--out", str(tmp_path / "o"), "--from", "hf-mamba"],
            "describes a transformers 'hgrn2' checkpoint, not the hf-mamba layout")
    refused(capsys, tmp_path, [str(hgrn2), "--out", str(tmp_path / "o"), "--from", "gguf"],
            "unknown layout 'gguf'", "fla-hgrn2")


def test_to_needs_a_linlm_model_of_the_layouts_architecture(tmp_path, capsys):
    linlm.create_model("tnl", preset="tiny", vocab_size=64).save(tmp_path / "tnl")
    refused(capsys, tmp_path, [str(tmp_path / "tnl"), "--out", str(tmp_path / "o"), "--to", "hf-mamba"],
            "hf-mamba holds 'mamba' models")
    refused(capsys, tmp_path, [str(tmp_path / "tnl"), "--out", str(tmp_path / "o"), "--to", "mamba-ssm"],
            "mamba-ssm converts one way only")
    refused(capsys, tmp_path, [str(tmp_path / "tnl"), "--out", str(tmp_path / "o")], "is a linlm model already")


def test_linlm_load_on_a_foreign_checkpoint_says_how_to_convert_it(tmp_path):
    src = fla_dir(tmp_path / "fla")
    with pytest.raises(CheckpointError, match=r"^\S+config.json: describes a transformers 'hgrn2' checkpoint, not a "
                                              r"linlm model; convert it first: linlm convert \S+ --out DIR"):
        linlm.load(src)
    (src / "config.json").write_text(json.dumps({"d_model": 32, "n_layer": 2, "vocab_size": 50}))
    with pytest.raises(CheckpointError, match=r"describes a mamba_ssm checkpoint, not a linlm model"):
        linlm.load(src)


def test_to_writes_a_foreign_directory_under_the_same_rules(tmp_path, capsys):
    src = fla_dir(tmp_path / "fla")
    (src / "tokenizer.json").write_text(TOKENIZER["tokenizer.json"])
    assert main(["convert", str(src), "--out", str(tmp_path / "ours")]) == 0
    back = [str(tmp_path / "ours"), "--out", str(tmp_path / "back"), "--to", "fla-hgrn2"]
    assert main(["convert", *back]) == 0
    assert (tmp_path / "back" / "tokenizer.json").read_text() == TOKENIZER["tokenizer.json"]
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == "hgrn2"
    capsys.readouterr()
    refused(capsys, tmp_path, back, "holds files already", "--overwrite")
    assert main(["convert", *back, "--overwrite"]) == 0
    capsys.readouterr()
    (tmp_path / "back" / "notes.txt").write_text("mine")
    refused(capsys, tmp_path, [*back, "--overwrite"], "notes.txt", "linlm did not write")


def test_a_run_directory_is_accepted_wherever_a_model_directory_is(tmp_path, text_file, capsys):
    """A linlm training run stands for its newest valid checkpoint, as in generate, eval and export: --to converts
    it, and without --to it is named as a linlm model already."""
    from linlm.train.train_config import TrainConfig
    from linlm.train.trainer import train

    run = tmp_path / "run"
    cfg = TrainConfig.from_dict({
        "model": {"arch": "llama", "overrides": {"n_layers": 1, "d_model": 32, "n_heads": 2, "max_seq_len": 64}},
        "data": {"source": str(text_file), "tokenizer": "bpe:300", "seq_len": 16}, "batch_size": 2, "steps": 1,
        "eval": {"every": 0}, "samples": {"prompts": []}, "out_dir": str(run), "threads": 1, "peak_flops": 1e11})
    train(cfg, verbose=False)
    assert main(["convert", str(run), "--out", str(tmp_path / "hf"), "--to", "hf-llama"]) == 0
    capsys.readouterr()
    back = tmp_path / "back"
    assert main(["convert", str(tmp_path / "hf"), "--out", str(back)]) == 0
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        assert torch.allclose(linlm.load(back)(ids), linlm.load(run / "checkpoints" / "step_00000001")(ids),
                              atol=1e-5)
    assert main(["convert", str(run), "--out", str(tmp_path / "again")]) == 2
    one_line_error(capsys.readouterr().err, "step_00000001: is a linlm model already", "pass --to")
    # The Python API reads a run directory as the command does: linlm.load and linlm.convert.
    with torch.no_grad():
        assert torch.equal(linlm.load(run)(ids), linlm.load(run / "checkpoints" / "step_00000001")(ids))
    py = linlm.convert(run, tmp_path / "hf-py", to="hf-llama")
    assert sorted(p.name for p in py.iterdir()) == sorted(p.name for p in (tmp_path / "hf").iterdir())
