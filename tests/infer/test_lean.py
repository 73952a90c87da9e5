"""Lean decoding (linlm.infer.lean): a saved Mamba decoded on the C kernels with numpy, no torch in the process. It
must give linlm's own logits (prefill across pieces, then steps; float32 and int8, one and two threads), never import
torch, never change the model's file, and refuse what it does not run with one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import linlm
from linlm.errors import CheckpointError, ConfigError
from linlm.infer import lean
from linlm.io_utils import sha256_file
from linlm.models.quant import quantize_model
from linlm.ops import kernel_library

pytestmark = pytest.mark.skipif(not kernel_library.available(), reason="the C kernels are not built")

STEPS = (5, 7, 9, 300)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Mamba (d 64, 2 layers, vocab 512, d_state 16) saved in float32 and in int8."""
    torch.manual_seed(0)
    model = linlm.create_model("mamba", preset="tiny").eval()
    root = tmp_path_factory.mktemp("lean")
    model.save(root / "fp32")
    quantize_model(model)
    model.save(root / "int8")
    return root


def _reference(path, ids, steps):
    """linlm's own logits: the model's prefill of ids, then a step for each token of steps."""
    model = linlm.load(path).eval()
    with torch.no_grad():
        logits, state = model.prefill(torch.tensor([ids]))
        out = [logits[0]]
        for t in steps:
            logits, state = model.step(torch.tensor([t]), state)
            out.append(logits[0])
    return torch.stack(out).numpy()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_prefill_and_steps_equal_linlms_own(saved, precision, threads):
    """A prompt longer than a prefill piece (PIECE tokens; the int8 products take 64 rows a call), then steps: the
    logits linlm's model gives, to float32 rounding."""
    ids = np.random.default_rng(1).integers(0, 512, lean.PIECE + 50).tolist()
    engine = lean.LeanMamba(saved / precision, threads=threads)
    got = [engine.prefill(ids).copy()] + [engine.step(t).copy() for t in STEPS]
    assert engine.position == len(ids) + len(STEPS)
    np.testing.assert_allclose(np.stack(got), _reference(saved / precision, ids, STEPS), rtol=0, atol=2e-5)


def test_a_prompt_in_parts_and_short_pieces_equal_one_prefill(saved):
    """prefill continues the state: a prompt given in parts (one of them shorter than the conv's window) ends where
    the whole prompt does; reset starts afresh."""
    ids = np.random.default_rng(2).integers(0, 512, 40).tolist()
    engine = lean.LeanMamba(saved / "fp32")
    whole = engine.prefill(ids).copy()
    engine.reset()
    engine.prefill(ids[:30])
    engine.prefill(ids[30:32])
    parts = engine.prefill(ids[32:]).copy()
    np.testing.assert_allclose(parts, whole, rtol=0, atol=1e-5)
    assert engine.state_nbytes() == 2 * (3 * 128 + 128 * 16) * 4  # 2 layers: conv window and scan state, float32


def test_generate_is_greedy_from_a_fresh_state(saved):
    ids = [3, 1, 4, 1, 5]
    engine = lean.LeanMamba(saved / "fp32")
    engine.prefill([7, 7, 7])  # an earlier sequence: generate starts afresh
    out = engine.generate(ids, 6)
    ref, model = [], linlm.load(saved / "fp32").eval()
    with torch.no_grad():
        logits, state = model.prefill(torch.tensor([ids]))
        for _ in range(6):
            ref.append(int(logits[0].argmax()))
            logits, state = model.step(torch.tensor([ref[-1]]), state)
    assert out == ref
    assert engine.generate(ids, 6, stop=ref[2]) == ref[:ref.index(ref[2]) + 1]  # up to and with the stop id
    assert engine.generate(ids, 0) == []


def test_the_process_never_imports_torch_nor_changes_the_file(saved):
    code = ("import sys, json; from linlm.infer.lean import LeanMamba\n"
            f"e = LeanMamba({str(saved / 'int8')!r}, threads=2)\n"
            "ids = e.generate(list(range(1, 80)), 5)\n"
            "print(json.dumps({'torch': 'torch' in sys.modules, 'ids': ids}))\n")
    before = sha256_file(saved / "int8" / "model.safetensors")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["torch"] is False and len(result["ids"]) == 5
    assert sha256_file(saved / "int8" / "model.safetensors") == before


def test_refuses_other_models_and_bad_input(saved, tmp_path):
    linlm.create_model("hgrn2", preset="tiny").save(tmp_path / "hgrn2")
    with pytest.raises(ConfigError, match="plain Mamba models; this is a 'hgrn2' model"):
        lean.LeanMamba(tmp_path / "hgrn2")
    linlm.create_model("mamba", preset="tiny", attn_every=2).save(tmp_path / "hybrid")
    with pytest.raises(ConfigError, match="no attention layers"):
        lean.LeanMamba(tmp_path / "hybrid")
    for threads in (0, True, 1.0):
        with pytest.raises(ConfigError, match="threads must be a positive integer"):
            lean.LeanMamba(saved / "fp32", threads=threads)
    engine = lean.LeanMamba(saved / "fp32")
    with pytest.raises(ConfigError, match=r"must lie in \[0, 512\)"):
        engine.step(512)
    with pytest.raises(ConfigError, match="non-empty sequence of integers"):
        engine.prefill([])
    for bad in (-1, 2.5, True):
        with pytest.raises(ConfigError, match="max_new_tokens: must be"):
            engine.generate([1], bad)


def test_refuses_changed_weights_and_switched_off_kernels(saved, tmp_path, monkeypatch):
    import shutil

    shutil.copytree(saved / "fp32", tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        lean.LeanMamba(tmp_path / "m")
    for step in ("step_00000010", "step_00000020"):
        shutil.copytree(saved / "fp32", tmp_path / "run" / "checkpoints" / step)
    with pytest.raises(CheckpointError, match=r"is a training run; .* its newest: .*step_00000020"):
        lean.LeanMamba(tmp_path / "run")
    lean.LeanMamba(tmp_path / "run" / "checkpoints" / "step_00000020")  # a checkpoint directory reads
    monkeypatch.setenv("LINLM_SCAN_BACKEND", "torch")
    with pytest.raises(ConfigError, match="LINLM_SCAN_BACKEND=torch"):
        lean.LeanMamba(saved / "fp32")


def test_sampling_top_k_one_is_greedy_and_a_seeded_draw_repeats(saved):
    """top_k 1 is greedy at any temperature; a seeded draw repeats; top_p keeps the most likely id at least."""
    engine = lean.LeanMamba(saved / "fp32")
    greedy = engine.generate([1, 2, 3], 8)
    assert list(engine.stream([1, 2, 3], 8, temperature=1.5, top_k=1)) == greedy
    assert list(engine.stream([1, 2, 3], 8, temperature=1e-3, top_p=1e-6, seed=3)) == greedy
    a, b, c = (list(engine.stream([1, 2, 3], 12, temperature=1.0, top_k=0, seed=s)) for s in (5, 5, 6))
    assert a == b and a != c
    with pytest.raises(ConfigError, match="top_p"):
        list(engine.stream([1], 2, top_p=0))


def _cli(args, cwd=None):
    """linlm's main in a fresh interpreter: (exit status, stdout, stderr, whether torch was imported)."""
    code = ("import sys; from linlm.cli import main\n"
            f"rc = main({args!r})\n"
            "print('TORCH', 'torch' in sys.modules)\n"
            "sys.exit(rc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd)
    lines = done.stdout.splitlines()
    return done.returncode, "\n".join(lines[:-1]), done.stderr, lines[-1] == "TORCH True" if lines else None


def _save_with_tokenizer(path, tokenizer, arch):
    torch.manual_seed(0)
    linlm.create_model(arch, preset="tiny", vocab_size=320).save(path)
    tokenizer.save(path)


def test_linlm_generate_lean_prints_what_linlm_generate_prints_without_torch(tmp_path, tokenizer):
    _save_with_tokenizer(tmp_path / "m", tokenizer, "mamba")
    common = ["generate", "--model", str(tmp_path / "m"), "--prompt", "the king", "--max-new-tokens", "12",
              "--temperature", "0", "--no-stream"]
    rc, lean_out, err, torch_loaded = _cli(common + ["--lean"])
    assert rc == 0, err
    assert torch_loaded is False
    rc, torch_out, err, torch_loaded = _cli(common)
    assert rc == 0 and torch_loaded is True, err
    assert lean_out == torch_out and lean_out.startswith("the king")
    rc, _, err, _ = _cli(common + ["--lean", "--device", "cuda"])
    assert rc == 2 and "--lean decodes on the CPU" in err and "Traceback" not in err
    _save_with_tokenizer(tmp_path / "llama", tokenizer, "llama")
    rc, _, err, torch_loaded = _cli(["generate", "--model", str(tmp_path / "llama"), "--lean", "--prompt", "a"])
    assert rc == 2 and "plain Mamba models; this is a 'llama' model" in err and torch_loaded is False
