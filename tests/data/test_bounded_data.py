"""`linlm data prepare` with a BPE size the tokenizers library cannot reserve: refused in one line before it aborts
the process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from linlm.data.tokenizer import BPE_MAX_VOCAB, Tokenizer, resolve_tokenizer
from linlm.errors import TokenizerError

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_a_bpe_beyond_the_bound_is_refused_in_a_subprocess_that_lives(tmp_path, text_file):
    """Run as a user would: the tokenizers library used to abort the whole process (exit 134, a Rust backtrace)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    out = tmp_path / "out"
    started = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "linlm", "data", "prepare", "--source", str(text_file), "--tokenizer",
                        "bpe:1000000000", "--out", str(out), "--no-progress"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert time.perf_counter() - started < 60
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "a BPE of 1,000,000,000 entries is more than linlm trains" in lines[0], r.stderr
    assert not out.exists()


def test_the_bound_itself_is_taken_and_one_more_is_not():
    assert resolve_tokenizer(f"bpe:{BPE_MAX_VOCAB}") == (None, BPE_MAX_VOCAB)
    with pytest.raises(TokenizerError, match="at most 4,194,304"):
        resolve_tokenizer(f"bpe:{BPE_MAX_VOCAB + 1}")
    with pytest.raises(TokenizerError, match="more than linlm trains"):
        Tokenizer.train(["a b c"], BPE_MAX_VOCAB + 1)
