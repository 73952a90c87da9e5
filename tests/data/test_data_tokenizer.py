"""Tokenizer: exact round trips, the end-of-text token, save/load, fingerprints, and bad input."""

from __future__ import annotations

import json
import random

import pytest

from linlm.data.tokenizer import EOS_TOKEN, Tokenizer, resolve_tokenizer
from linlm.errors import TokenizerError

AWKWARD = [
    "",
    " ",
    "   leading and trailing   ",
    "\t\ttabs\tand\nnew\nlines\r\nand CRLF\r\n\n\n",
    "emoji 🎉👍🏽👨‍👩‍👧 and flags 🇫🇷",
    "CJK 東京都 データ, Hangul 한국어, Arabic مرحبا, combining e\u0301 and NFC é",
    "zero width\u200b joiner\u200d, BOM \ufeff, NUL \x00, DEL \x7f, U+FFFD \ufffd",
    "a literal " + EOS_TOKEN + " in the text",
    "astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈",
]


def _random_unicode(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        ranges = [(0x20, 0x7F), (0, 0x20), (0x80, 0x800), (0x800, 0xD800), (0xE000, 0x10000), (0x10000, 0x110000)]
        cp = rng.randrange(*rng.choice(ranges))  # every plane, control characters included, no surrogates
        out.append(chr(cp))
    return "".join(out)


def test_train_gives_the_requested_vocab_and_eos(tiny_tokenizer):
    assert tiny_tokenizer.vocab_size == 300
    assert tiny_tokenizer.eos_token == EOS_TOKEN
    assert tiny_tokenizer.decode([tiny_tokenizer.eos_id]) == EOS_TOKEN
    assert max(max(tiny_tokenizer.encode(s), default=0) for s in AWKWARD) < 300


@pytest.mark.parametrize("text", AWKWARD)
def test_round_trip_is_exact(tiny_tokenizer, text):
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text)) == text


def test_round_trip_random_unicode(tiny_tokenizer):
    rng = random.Random(0)
    texts = [_random_unicode(rng, rng.randint(1, 200)) for _ in range(200)]
    for text, ids in zip(texts, tiny_tokenizer.encode_batch(texts)):
        assert ids == tiny_tokenizer.encode(text)
        assert tiny_tokenizer.decode(ids) == text


def test_literal_eos_text_is_not_a_document_boundary(tiny_tokenizer):
    ids = tiny_tokenizer.encode("a " + EOS_TOKEN + " b")
    assert tiny_tokenizer.eos_id not in ids


def test_save_load_same_fingerprint_and_ids(tiny_tokenizer, tmp_path):
    path = tiny_tokenizer.save(tmp_path / "tok")
    assert path.name == "tokenizer.json"
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert config["eos_token"] == EOS_TOKEN
    for where in (tmp_path / "tok", path, str(path)):
        loaded = Tokenizer.from_pretrained(where)
        assert loaded.fingerprint() == tiny_tokenizer.fingerprint()
        assert loaded.eos_id == tiny_tokenizer.eos_id and loaded.vocab_size == 300
        assert loaded.encode(AWKWARD[4]) == tiny_tokenizer.encode(AWKWARD[4])


def test_save_writes_linlms_files_and_refuses_a_users_file(tiny_tokenizer, tmp_path):
    from linlm import outputs
    from linlm.errors import OutputError

    tiny_tokenizer.save(tmp_path / "a")
    assert outputs.owns_file(tmp_path / "a" / "tokenizer.json")
    assert outputs.owns_file(tmp_path / "a" / "tokenizer_config.json")
    tiny_tokenizer.save(tmp_path / "a")  # its own files: rewritten
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "tokenizer_config.json").write_text('{"the": "user\'s"}')
    with pytest.raises(OutputError, match="tokenizer_config.json"):
        tiny_tokenizer.save(tmp_path / "b")
    # both names are checked first: nothing was written, not even tokenizer.json
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["tokenizer_config.json"]
    assert (tmp_path / "b" / "tokenizer_config.json").read_text() == '{"the": "user\'s"}'


def test_saved_tokenizer_loads_in_transformers(tiny_tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    tiny_tokenizer.save(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf.eos_token_id == tiny_tokenizer.eos_id
    ids = tiny_tokenizer.encode(AWKWARD[5])
    assert hf.decode(ids) == AWKWARD[5]


def test_fingerprint_differs_between_tokenizers(tiny_tokenizer, docs):
    other = Tokenizer.train(docs, 290)
    assert other.fingerprint() != tiny_tokenizer.fingerprint()
    again = Tokenizer.train(docs, 300)
    assert again.fingerprint() == tiny_tokenizer.fingerprint()  # training is deterministic


def test_ensure_fits(tiny_tokenizer):
    tiny_tokenizer.ensure_fits(300)
    tiny_tokenizer.ensure_fits(512)
    with pytest.raises(TokenizerError, match="300 token ids but the model's vocab_size is 299") as err:
        tiny_tokenizer.ensure_fits(299)
    assert "vocab_size=320" in str(err.value)


def test_vocab_too_small_to_train(docs):
    with pytest.raises(TokenizerError, match="at least 257"):
        Tokenizer.train(docs, 100)
    with pytest.raises(TokenizerError, match="vocab size >= 257"):
        resolve_tokenizer("bpe:12")
    with pytest.raises(TokenizerError, match="bpe:VOCAB_SIZE with an integer"):
        resolve_tokenizer("bpe:big")
    assert resolve_tokenizer("bpe:4096") == (None, 4096)


def test_missing_paths_fail_fast_without_a_hub_lookup(tmp_path, monkeypatch):
    def no_hub(*a, **k):
        raise AssertionError("a path must not be looked up on the hub")

    monkeypatch.setattr(Tokenizer, "_from_transformers", classmethod(no_hub))
    with pytest.raises(TokenizerError, match="no such file or directory"):
        Tokenizer.from_pretrained(tmp_path / "missing" / "tokenizer.json")
    with pytest.raises(TokenizerError, match="no such file or directory"):
        Tokenizer.from_pretrained("./missing.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerError, match="has no tokenizer.json"):
        Tokenizer.from_pretrained(tmp_path / "empty")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a valid tokenizers JSON"):
        Tokenizer.from_pretrained(tmp_path / "bad.json")


def test_hub_name_that_cannot_be_loaded_is_a_tokenizer_error(monkeypatch):
    transformers = pytest.importorskip("transformers")

    def offline(*a, **k):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", offline)
    with pytest.raises(TokenizerError, match="could not load it by name .*couldn't connect"):
        Tokenizer.from_pretrained("some-org/some-tokenizer")


def test_pretrained_without_a_known_eos_needs_eos_token(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    backend = HFTokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "<end>": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerError, match="cannot tell which token ends a document"):
        Tokenizer.from_pretrained(tmp_path)
    assert Tokenizer.from_pretrained(tmp_path, eos_token="<end>").eos_id == 2
    with pytest.raises(TokenizerError, match="no token '<nope>'"):
        Tokenizer.from_pretrained(tmp_path, eos_token="<nope>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<end>"}}))
    assert Tokenizer.from_pretrained(tmp_path).eos_id == 2
