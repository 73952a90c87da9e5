"""Generation: sampling settings, decode against full recompute, the `linlm generate` command and its errors."""

import math
import subprocess
import sys

import pytest
import torch

from linlm import create_model
from linlm.cli import main
from linlm.errors import ConfigError, ShapeError
from linlm.infer.generate import check_sampling, generate, generate_ids, sample_token, stream_text


@pytest.mark.parametrize("kw, match", [
    (dict(temperature=math.nan), "temperature"), (dict(temperature=-0.1), "temperature"),
    (dict(temperature=math.inf), "temperature"), (dict(top_k=-1), "top_k"),
    (dict(top_p=0.0), r"top_p: must be in \(0, 1\]"), (dict(top_p=1.5), "top_p"), (dict(top_p=math.nan), "top_p"),
    (dict(max_new_tokens=-1), "max_new_tokens"),
])
def test_sampling_settings_out_of_range(kw, match):
    args = dict(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=1) | kw
    with pytest.raises(ConfigError, match=match):
        check_sampling(**args)


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    g = torch.Generator().manual_seed(0)
    seen = {int(sample_token(logits, 1.0, 0, g, top_p=0.75)) for _ in range(300)}
    assert seen == {0, 1}  # 0.5 < 0.75, 0.5 + 0.3 reaches it
    seen = {int(sample_token(logits, 1.0, 0, g, top_p=0.81)) for _ in range(300)}
    assert seen == {0, 1, 2}
    assert {int(sample_token(logits, 1.0, 0, g, top_p=0.1)) for _ in range(50)} == {0}
    assert {int(sample_token(logits, 1.0, 2, g, top_p=1.0)) for _ in range(300)} == {0, 1}


@pytest.mark.parametrize("arch", ["llama", "hgrn2", "mossnet"])
def test_greedy_decode_equals_full_recompute(arch):
    model = create_model(arch, preset="tiny").eval()
    prompt = torch.randint(0, 512, (7,)).tolist()
    new = generate_ids(model, prompt, 12, temperature=0)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert new == ids[len(prompt):]


def test_sampling_is_seeded():
    model = create_model("tnl", preset="tiny").eval()
    a = generate_ids(model, [1, 2, 3], 20, temperature=1.0, top_k=0, top_p=0.9, seed=5)
    b = generate_ids(model, [1, 2, 3], 20, temperature=1.0, top_k=0, top_p=0.9, seed=5)
    c = generate_ids(model, [1, 2, 3], 20, temperature=1.0, top_k=0, top_p=0.9, seed=6)
    assert a == b != c


def test_prompt_longer_than_llama_limit(tokenizer):
    model = create_model("llama", preset="tiny", max_seq_len=32, vocab_size=320).eval()
    prompt = "the king and queen " * 20
    with pytest.raises(ShapeError, match=r"exceed this llama model's max_seq_len=32.*--truncate-prompt"):
        generate(model, tokenizer, prompt, 8)
    ids = tokenizer.encode(prompt)
    kept = generate_ids(model, ids, 8, temperature=0, truncate=True)
    assert kept == generate_ids(model, ids[-24:], 8, temperature=0)
    with pytest.raises(ShapeError, match="leaves no room"):
        generate_ids(model, ids, 32, temperature=0, truncate=True)


def test_stream_pieces_join_to_the_completion(tokenizer):
    model = create_model("hgrn2", preset="tiny", vocab_size=320).eval()
    pieces = list(stream_text(model, tokenizer, "the king", 15, temperature=1.0, seed=3))
    assert len(pieces) > 1
    assert "".join(pieces) == generate(model, tokenizer, "the king", 15, temperature=1.0, seed=3)


def test_cli_generate_model_prompt_file_and_stream(model_dir, tmp_path, capsys):
    args = ["generate", "--model", str(model_dir), "--max-new-tokens", "6", "--temperature", "0.7", "--top-p", "0.9",
            "--top-k", "0", "--seed", "2"]
    assert main(args + ["--prompt", "the queen"]) == 0
    plain = capsys.readouterr().out
    assert plain.startswith("the queen") and len(plain) > len("the queen\n")
    assert main(args + ["--prompt", "the queen", "--stream"]) == 0
    assert capsys.readouterr().out == plain
    (tmp_path / "p.txt").write_text("the queen")
    assert main(args + ["--prompt-file", str(tmp_path / "p.txt")]) == 0
    assert capsys.readouterr().out == plain
    # --checkpoint stays an alias of --model.
    assert main(["generate", "--checkpoint", str(model_dir), "--prompt", "the queen"] + args[3:]) == 0
    assert capsys.readouterr().out == plain


@pytest.mark.parametrize("flags, match", [
    (["--temperature", "nan"], "temperature"),
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], r"--top-p: expected a number > 0 and <= 1 .*, got '0'"),
    (["--top-p", "1.5"], r"--top-p: expected a number > 0 and <= 1 .*, got '1.5'"),
    (["--device", "bogus"], r"device: 'bogus' is not a device"),
    (["--prompt", "the king " * 40], r"max_seq_len=64.*--truncate-prompt"),
    (["--prompt-file", "/nonexistent/prompt.txt"], r"--prompt-file /nonexistent/prompt.txt: cannot be read"),
])
def test_cli_bad_input_is_one_line_exit_2(model_dir, flags, match, capsys):
    assert main(["generate", "--model", str(model_dir), "--max-new-tokens", "4"] + flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("linlm: error: ")
    import re

    assert re.search(match, err), err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
def test_cli_cuda_where_absent(model_dir):
    proc = subprocess.run([sys.executable, "-m", "linlm", "generate", "--model", str(model_dir), "--device", "cuda"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "CUDA is not available" in proc.stderr and proc.stderr.count("\n") == 1


def test_cli_truncate_prompt(model_dir, capsys):
    assert main(["generate", "--model", str(model_dir), "--prompt", "the king " * 40, "--truncate-prompt",
                 "--max-new-tokens", "4", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("the king")


def test_cli_generate_compile(model_dir, tmp_path, tokenizer, capsys):
    torch._dynamo.reset()
    torch.manual_seed(0)
    create_model("mamba", preset="tiny", vocab_size=320).save(tmp_path / "mamba")
    tokenizer.save(tmp_path / "mamba")
    args = ["--prompt", "the king", "--max-new-tokens", "5", "--temperature", "0", "--no-stream"]
    assert main(["generate", "--model", str(tmp_path / "mamba"), *args]) == 0
    eager = capsys.readouterr().out
    assert main(["generate", "--model", str(tmp_path / "mamba"), "--compile", *args]) == 0
    compiled = capsys.readouterr()
    assert compiled.out == eager and "decoding eagerly" not in compiled.err
    # A KV cache grows each step: that model says so and decodes eagerly, with the same text.
    assert main(["generate", "--model", str(model_dir), *args]) == 0
    plain = capsys.readouterr().out
    assert main(["generate", "--model", str(model_dir), "--compile", *args]) == 0
    out = capsys.readouterr()
    assert out.out == plain and "keeps a KV cache" in out.err
