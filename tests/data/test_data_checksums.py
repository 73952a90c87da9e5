"""Shard integrity: block checksums written by prepare and verified as a TokenDataset reads; ids out of range."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import linlm.data.checksums as checksums
from linlm.data.loader import Batches, TokenDataset
from linlm.data.prepare import prepare
from linlm.errors import DataError


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(checksums, "BLOCK_BYTES", 256)  # 128 uint16 tokens per block
    return 256


@pytest.fixture
def out(corpus_dir, tiny_tokenizer, tmp_path, small_blocks):
    out = tmp_path / "prepared"
    prepare(corpus_dir, tiny_tokenizer, out, val_fraction=0.0, shard_tokens=1000, split_chars=400, progress=False)
    return out


def _flip(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_prepare_records_whole_and_block_checksums(out, small_blocks):
    import hashlib

    meta = json.loads((out / "meta.json").read_text())
    shard = meta["splits"]["train"]["shards"][0]
    blob = (out / shard["file"]).read_bytes()
    assert shard["sha256"] == hashlib.sha256(blob).hexdigest()
    assert shard["blocks"]["bytes"] == small_blocks and len(shard["blocks"]["sha256"]) == -(-len(blob) // 256)
    assert shard["blocks"]["sha256"][1] == hashlib.sha256(blob[256:512]).hexdigest()


def test_a_shard_changed_in_place_is_found_before_its_tokens_are_used(out):
    _flip(out / "train" / "000001.bin", 300)  # block 1 of shard 1: tokens 1128..1255 of the split
    ds = TokenDataset(out)  # same size: opening is cheap and does not read the data
    np.testing.assert_array_equal(ds.read(0, 1000), np.fromfile(out / "train" / "000000.bin", "<u2"))
    ds.read(1000, 128)  # block 0 of shard 1 is intact
    with pytest.raises(DataError, match=r"000001\.bin: bytes 256-512 do not match their sha256.*"
                                        r"linlm data prepare .*--overwrite"):
        ds.read(1100, 100)
    batches = Batches(TokenDataset(out), batch_size=len(ds) // 33, seq_len=32, shuffle=False)
    with pytest.raises(DataError, match="changed or corrupted"):
        next(batches)  # the first batch covers the whole split
    with pytest.raises(DataError, match="changed or corrupted"):
        TokenDataset(out, verify=True)


def test_a_directory_from_before_block_checksums_is_verified_by_whole_shard(out):
    meta = json.loads((out / "meta.json").read_text())
    for shard in meta["splits"]["train"]["shards"]:
        del shard["blocks"]
    (out / "meta.json").write_text(json.dumps(meta))
    ds = TokenDataset(out)
    ds.read(0, len(ds))
    _flip(out / "train" / "000002.bin", 7)
    with pytest.raises(DataError, match=r"000002\.bin: bytes 0-2000 do not match"):
        TokenDataset(out).read(2500, 1)


def _strip_checksums(out):
    meta = json.loads((out / "meta.json").read_text())
    for shard in meta["splits"]["train"]["shards"]:
        del shard["blocks"], shard["sha256"]
    (out / "meta.json").write_text(json.dumps(meta))
    return meta


def test_a_directory_without_checksums_opens_with_a_warning(out, caplog):
    _strip_checksums(out)
    with caplog.at_level(logging.WARNING, logger="linlm.data"):
        ds = TokenDataset(out)
    assert "no checksum" in caplog.text and "--overwrite" in caplog.text
    assert len(ds.read(0, len(ds))) == len(ds)


def test_ids_outside_the_vocabulary_are_a_corrupt_shard(out):
    meta = _strip_checksums(out)  # no checksum to catch the change: the range check must
    path = out / "train" / "000003.bin"
    tokens = np.fromfile(path, "<u2")
    tokens[17] = meta["vocab_size"] + 5
    tokens.tofile(path)
    ds = TokenDataset(out)
    ds.read(0, 3000)
    with pytest.raises(DataError, match=rf"000003\.bin: token 17 is id {meta['vocab_size'] + 5}, outside the "
                                        r"data's vocabulary.*corrupt.*linlm data prepare"):
        ds.read(2990, 100)


def test_training_on_a_corrupt_shard_stops_with_a_data_error(corpus_dir, tiny_tokenizer, tmp_path):
    from linlm.train.train_config import TrainConfig
    from linlm.train import train

    data = tmp_path / "prepared"
    prepare(corpus_dir, tiny_tokenizer, data, val_fraction=0.1, split_chars=400, progress=False)
    _flip(data / "train" / "000000.bin", 100)
    cfg = TrainConfig.from_dict({
        "model": {"arch": "llama", "overrides": {"n_layers": 1, "d_model": 32, "n_heads": 2, "max_seq_len": 64}},
        "data": {"dir": str(data), "seq_len": 32}, "eval": {"every": 0}, "samples": {"max_new_tokens": 0},
        "out_dir": str(tmp_path / "run"), "steps": 2, "batch_size": 2, "threads": 1})
    with pytest.raises(DataError, match=r"000000\.bin: .*do not match their sha256"):
        train(cfg, verbose=False)
    assert not list((tmp_path / "run").glob("checkpoints/step-*"))
