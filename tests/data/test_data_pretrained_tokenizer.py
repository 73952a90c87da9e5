"""Pretrained tokenizers: the BOS rule read from the config files, and the one resolution a model command uses."""

from __future__ import annotations

import json

import pytest
from tokenizer_files import write_pretrained_tokenizer

from linlm.data.tokenizer import Tokenizer, tokenizer_for_model
from linlm.errors import TokenizerError

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "Question: how do I keep bread fresh?"] * 5


def test_linlm_own_tokenizer_has_no_bos(tiny_tokenizer, tmp_path):
    tiny_tokenizer.save(tmp_path)
    tok = tokenizer_for_model(tmp_path)
    assert tok.bos_id is None and not tok.add_bos and tok.prefix_id == tok.eos_id
    assert tok.encode_input("the cat") == tok.encode("the cat") == tiny_tokenizer.encode("the cat")
    assert tok.fingerprint() == tiny_tokenizer.fingerprint()


def test_pretrained_tokenizer_adds_its_bos(tmp_path):
    tok = Tokenizer.from_pretrained(write_pretrained_tokenizer(tmp_path, TEXTS))
    assert (tok.bos_id, tok.eos_id, tok.prefix_id, tok.add_bos) == (1, 2, 1, True)
    ids = tok.encode("the cat sat")
    assert ids and 1 not in ids and tok.encode_input("the cat sat") == [1, *ids]
    assert tok.decode(ids) == "the cat sat"
    assert tok.encode_input("") == [1]


@pytest.mark.parametrize("post_bos, add_bos_token, adds", [
    (True, None, True),     # no config key: the post-processor decides
    (False, None, False),
    (True, False, False),   # the config key wins
    (False, True, True),
])
def test_add_bos_from_the_config_else_the_post_processor(tmp_path, post_bos, add_bos_token, adds):
    tok = Tokenizer.from_pretrained(write_pretrained_tokenizer(tmp_path, TEXTS, post_bos=post_bos,
                                                               add_bos_token=add_bos_token))
    assert tok.add_bos is adds and tok.prefix_id == 1
    assert tok.encode_input("a dog") == [1] * adds + tok.encode("a dog")


def test_bos_named_only_in_the_special_tokens_map(tmp_path):
    tok = Tokenizer.from_pretrained(write_pretrained_tokenizer(tmp_path, TEXTS, config_bos=False))
    assert tok.bos_id == 1 and tok.add_bos
    (tmp_path / "special_tokens_map.json").unlink()
    tok = Tokenizer.from_pretrained(tmp_path)  # no file names a BOS: none, whatever the post-processor does
    assert tok.bos_id is None and not tok.add_bos and tok.encode_input("a dog") == tok.encode("a dog")


def test_encoding_matches_transformers_default(tmp_path):
    transformers = pytest.importorskip("transformers")
    directory = write_pretrained_tokenizer(tmp_path, TEXTS, add_bos_token=None)
    hf = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    tok = Tokenizer.from_pretrained(directory)
    assert (tok.bos_id, tok.eos_id) == (hf.bos_token_id, hf.eos_token_id)
    for text in ("the cat sat on the mat", "Question: how", " a dog ran"):
        assert tok.encode_input(text) == hf.encode(text)
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False)


def test_resolution_order(tiny_tokenizer, tmp_path):
    model_dir = write_pretrained_tokenizer(tmp_path / "model", TEXTS)
    assert tokenizer_for_model(model_dir).bos_id == 1
    tiny_tokenizer.save(tmp_path / "other")
    given = tokenizer_for_model(model_dir, tmp_path / "other")  # --tokenizer wins over the files beside the weights
    assert given.fingerprint() == tiny_tokenizer.fingerprint() and given.bos_id is None
    (tmp_path / "bare").mkdir()
    with pytest.raises(TokenizerError, match="no tokenizer beside the weights .*pass --tokenizer PATH"):
        tokenizer_for_model(tmp_path / "bare")


def test_too_large_vocabulary_names_both_sizes(tmp_path):
    model_dir = write_pretrained_tokenizer(tmp_path, TEXTS)
    n = Tokenizer.from_pretrained(model_dir).vocab_size
    assert tokenizer_for_model(model_dir, vocab_size=n).vocab_size == n
    with pytest.raises(TokenizerError, match=f"has {n} token ids but the model's vocab_size is {n - 1}"):
        tokenizer_for_model(model_dir, vocab_size=n - 1)


def test_transformers_files_without_tokenizer_json(tiny_tokenizer, tmp_path):
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer as Backend

    Backend.from_str(tiny_tokenizer.to_str()).model.save(str(tmp_path))  # vocab.json + merges.txt, as GPT-2 has
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}))
    tok = tokenizer_for_model(tmp_path)
    text = "the king rides north at dawn"
    assert tok.encode(text) == tiny_tokenizer.encode(text) and tok.decode(tok.encode(text)) == text
    assert tok.eos_id == tok.prefix_id == tiny_tokenizer.eos_id and not tok.add_bos


def test_transformers_files_it_cannot_load_are_one_line(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    with pytest.raises(TokenizerError, match="directory without tokenizer.json, and transformers could not") as err:
        tokenizer_for_model(tmp_path)
    assert "\n" not in str(err.value)
