"""docs/inference.md's worked example runs as written, offline: the two hub downloads and `linlm eval fetch` are
replaced by tiny random checkpoints of the same layouts (with a small pretrained-style tokenizer.json) and the test
task files, written at the paths those commands name; the other commands run through linlm's CLI entry point. Only
the profile's sizes change, by the substitutions of TINY (each must be found in the block)."""

import json
import shlex
import shutil
from pathlib import Path

from safetensors.torch import save_file

import linlm
from linlm.cli import main

import fla_reference as fla
from test_mamba_conversion import random_hf_mamba
from test_readme import commands, shrink
from tokenizer_files import write_pretrained_tokenizer

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "eval" / "data"
TINY = {"--preset paper-160m --set d_model=768 --set n_layers=24": "--preset tiny --threads 1 --decode-tokens 2",
        "--contexts 512,2048,8192": "--contexts 16"}
VOCAB = 208
TASKS = ["piqa", "hellaswag", "arc_easy", "arc_challenge", "winogrande", "lambada"]


def example_block() -> str:
    text = (ROOT / "docs" / "inference.md").read_text(encoding="utf-8")
    return text.split("<!-- worked-example -->\n```bash\n", 1)[1].split("```", 1)[0]


def fake_download(repo: str, out: Path) -> None:
    texts = [ln for f in sorted(DATA.glob("*.jsonl")) for ln in f.read_text().splitlines()]
    if "mamba" in repo:
        random_hf_mamba(vocab=VOCAB).save_pretrained(out)
    else:
        config = dict(model_type="hgrn2", architectures=["HGRN2ForCausalLM"], hidden_size=32, num_hidden_layers=2,
                      num_heads=4, expand_ratio=8, vocab_size=VOCAB)
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps(config))
        save_file(fla.random_state(config), str(out / "model.safetensors"))
    write_pretrained_tokenizer(out, texts, vocab_size=VOCAB)


def test_worked_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cmds = commands(shrink(example_block(), TINY))
    assert [c[:2] for c in cmds] == [["huggingface-cli", "download"]] * 2 + [["linlm", "convert"]] * 2 + [
        ["linlm", "eval"]] * 3 + [["linlm", "profile"]] + [["linlm", "export"]] * 2
    for argv in cmds:
        if argv[0] == "huggingface-cli":
            fake_download(argv[2], tmp_path / argv[argv.index("--local-dir") + 1])
        elif argv[1:3] == ["eval", "fetch"]:
            shutil.copytree(DATA, tmp_path / argv[argv.index("--out") + 1], ignore=shutil.ignore_patterns("hub"))
        else:
            assert main(argv[1:]) == 0, f"`{shlex.join(argv)}` failed"
    for name in ("mamba-130m", "hgrn2-1.3B"):
        assert linlm.load(tmp_path / "models" / name).config.vocab_size == VOCAB
        results = json.loads((tmp_path / "results" / f"{name}.json").read_text())
        assert list(results["tasks"]) == TASKS and results["model"] == f"models/{name}"
        for task in TASKS:
            assert 0 <= results["tasks"][task][results["tasks"][task]["metric"]] <= 1
        for suffix in ("prefill.pt2", "step.pt2", "json"):
            assert (tmp_path / "exports" / f"{name}.{suffix}").is_file()
    assert json.loads((tmp_path / "results" / "profile-mamba.json").read_text())
