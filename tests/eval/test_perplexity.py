"""Perplexity: the stateful and sliding modes against their definitions, bits per byte, and the CLI."""

import json
import math

import pytest
import torch

from linlm import create_model, load
from linlm.errors import ConfigError, ShapeError
from linlm.eval.perplexity import perplexity, sliding_windows

DOCS = ["The rain had stopped and the grass was wet. " * 6, "He counted the coins twice.", "Seeds are spread by birds."]


def _nll_full(model, seq):
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([seq[:-1]]))[0].double(), -1)
    return -float(logp.gather(-1, torch.tensor(seq[1:])[:, None]).sum())


@pytest.mark.parametrize("arch", ["tnl", "mamba", "llama"])
def test_stateful_equals_one_full_pass(arch, tokenizer):
    model = create_model(arch, preset="tiny", vocab_size=320).eval()
    res = perplexity(model, tokenizer, DOCS, mode="stateful", chunk=7, batch_size=2)
    seqs = [[tokenizer.eos_id] + tokenizer.encode(d) for d in DOCS]
    ref = sum(_nll_full(model, s) for s in seqs)
    assert res.nll == pytest.approx(ref, rel=1e-5)
    assert res.tokens == sum(len(s) - 1 for s in seqs) and res.documents == 3
    assert res.bytes == sum(len(d.encode()) for d in DOCS) and res.words == sum(len(d.split()) for d in DOCS)
    assert res.bits_per_byte == pytest.approx(ref / (res.bytes * math.log(2)))
    assert res.token_perplexity == pytest.approx(math.exp(ref / res.tokens))


def test_sliding_window_context_is_the_window(tokenizer):
    """stride 1: every token after the first window is predicted from exactly the `window` tokens before it."""
    model = create_model("llama", preset="tiny", vocab_size=320).eval()
    W = 6
    seq = [tokenizer.eos_id] + tokenizer.encode(DOCS[0])[:30]
    text = tokenizer.decode(seq[1:])
    assert [tokenizer.eos_id] + tokenizer.encode(text) == seq
    res = perplexity(model, tokenizer, [text], mode="sliding", window=W, stride=1, batch_size=5)
    ref = 0.0
    for p in range(1, len(seq)):
        ctx = seq[max(0, p - W):p]
        with torch.no_grad():
            ref -= float(torch.log_softmax(model(torch.tensor([ctx]))[0, -1].double(), -1)[seq[p]])
    assert res.nll == pytest.approx(ref, rel=1e-5)
    # A window as long as the document is the full pass.
    whole = perplexity(model, tokenizer, [text], mode="sliding", window=64, stride=10)
    assert whole.nll == pytest.approx(_nll_full(model, seq), rel=1e-5)


def test_sliding_windows_score_each_position_once():
    for n, w, s in [(2, 4, 2), (50, 8, 3), (50, 8, 8), (9, 8, 1), (100, 1, 1)]:
        scored = []
        for start, end, first in sliding_windows(n, w, s):
            assert end - start <= w and start <= first - 1 < end
            scored.extend(range(first, end + 1))
        assert scored == list(range(1, n))
    with pytest.raises(ConfigError, match="stride"):
        sliding_windows(10, 4, 5)


def test_modes_and_limits(tokenizer):
    llama = create_model("llama", preset="tiny", vocab_size=320, max_seq_len=16).eval()
    res = perplexity(llama, tokenizer, DOCS)  # auto: sliding with the model's limit
    assert res.mode == "sliding" and res.window == 16
    with pytest.raises(ShapeError, match="sliding"):
        perplexity(llama, tokenizer, DOCS, mode="stateful")
    with pytest.raises(ConfigError, match="max_seq_len"):
        perplexity(llama, tokenizer, DOCS, mode="sliding", window=32)
    tnl = create_model("tnl", preset="tiny", vocab_size=320).eval()
    assert perplexity(tnl, tokenizer, DOCS, max_docs=2).documents == 2
    assert perplexity(tnl, tokenizer, DOCS).mode == "stateful"
    with pytest.raises(ConfigError, match="mode"):
        perplexity(tnl, tokenizer, DOCS, mode="bogus")


def test_perplexity_cli(model_dir, tmp_path, capsys):
    from linlm.cli import main

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"body": d}) + "\n" for d in DOCS))
    out = tmp_path / "ppl.json"
    assert main(["perplexity", "--model", str(model_dir), "--source", str(src), "--text-field", "body",
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["documents"] == 3 and res["mode"] == "stateful" and res["bits_per_byte"] > 0
    model = load(model_dir)
    from linlm.data.tokenizer import Tokenizer

    direct = perplexity(model, Tokenizer.from_pretrained(model_dir), DOCS)
    assert res["nll"] == pytest.approx(direct.nll, rel=1e-6)
    assert main(["perplexity", "--model", str(model_dir), "--source", str(tmp_path / "nope.txt")]) == 2
    assert "not found" in capsys.readouterr().err


@pytest.mark.parametrize("kw", [dict(window=0), dict(stride=0), dict(window=8, stride=0), dict(max_docs=0),
                                dict(max_tokens=0)])
def test_zero_is_refused_never_read_as_the_default(kw, tokenizer):
    """None takes a default (max_seq_len, window / 2, no limit); a 0 is a value, and an impossible one."""
    llama = create_model("llama", preset="tiny", vocab_size=320, max_seq_len=16).eval()
    name = next(iter(kw)) if len(kw) == 1 else "stride"
    with pytest.raises(ConfigError, match=f"{name}: must be >= 1, got 0"):
        perplexity(llama, tokenizer, DOCS, mode="sliding", **kw)
