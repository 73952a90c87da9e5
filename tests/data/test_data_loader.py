"""TokenDataset and Batches: round trips, epochs, resuming, ranks, world sizes, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from linlm.data.loader import Batches, TokenDataset
from linlm.data.prepare import prepare
from linlm.data.tokenizer import EOS_TOKEN
from linlm.errors import ConfigError, DataError

T = 64


@pytest.fixture(scope="module")
def prepared(corpus_dir, tiny_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    # Small shards, so that many windows cross a shard boundary.
    prepare(corpus_dir, tiny_tokenizer, out, val_fraction=0.0, shard_tokens=1000, split_chars=400, progress=False)
    return out


@pytest.fixture(scope="module")
def ds(prepared):
    return TokenDataset(prepared, "train")


def _all_tokens(prepared):
    meta = json.loads((prepared / "meta.json").read_text())
    return np.concatenate([np.fromfile(prepared / s["file"], dtype=meta["dtype"])
                           for s in meta["splits"]["train"]["shards"]]).astype(np.int64)


def test_read_across_shards(ds, prepared):
    tokens = _all_tokens(prepared)
    assert len(ds) == len(tokens) and len(ds.meta["splits"]["train"]["shards"]) > 3
    for start, length in [(0, 1), (990, 20), (999, 1001), (0, len(tokens)), (len(tokens) - 5, 5), (1000, 0)]:
        np.testing.assert_array_equal(ds.read(start, length), tokens[start:start + length])
    with pytest.raises(IndexError):
        ds.read(len(tokens) - 2, 3)


def test_round_trip_through_the_loader(ds, docs, tiny_tokenizer):
    batches = Batches(ds, batch_size=3, seq_len=T, shuffle=False)
    n = ds.num_sequences(T)
    inputs, last_target = [], None
    for step in range(-(-n // 3)):
        x, y = next(batches)
        assert x.shape == y.shape == (3, T) and x.dtype == y.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
        for row in range(3):
            if len(inputs) < n:
                inputs.append(x[row])
                last_target = y[row, -1]
    stream = torch.cat(inputs + [last_target.view(1)]).tolist()
    text = "".join(d + EOS_TOKEN for d in docs)
    decoded = tiny_tokenizer.decode(stream)
    assert len(stream) == n * T + 1 and text.startswith(decoded) and len(decoded) > 0.95 * len(text)


def test_epochs_are_permutations_reshuffled_deterministically(ds):
    n = ds.num_sequences(T)
    b = Batches(ds, batch_size=1, seq_len=T, seed=5)
    epoch0 = np.concatenate([b.sequence_ids(s) for s in range(n)])
    epoch1 = np.concatenate([b.sequence_ids(s) for s in range(n, 2 * n)])
    assert sorted(epoch0) == list(range(n)) and sorted(epoch1) == list(range(n))
    assert not np.array_equal(epoch0, epoch1)
    again = Batches(ds, batch_size=1, seq_len=T, seed=5)
    np.testing.assert_array_equal(np.concatenate([again.sequence_ids(s) for s in range(n)]), epoch0)
    other = Batches(ds, batch_size=1, seq_len=T, seed=6)
    assert not np.array_equal(np.concatenate([other.sequence_ids(s) for s in range(n)]), epoch0)
    # A batch straddling the epoch boundary takes the end of one permutation and the start of the next.
    b4 = Batches(ds, batch_size=4, seq_len=T, seed=5)
    step = n // 4
    np.testing.assert_array_equal(b4.sequence_ids(step), np.concatenate([epoch0, epoch1])[4 * step:4 * step + 4])


def test_resume_mid_epoch_gives_identical_batches(ds):
    n = ds.num_sequences(T)
    run = Batches(ds, batch_size=4, seq_len=T, seed=1)
    steps = n // 4 + 3  # runs past the end of the first epoch
    for _ in range(steps - 5):
        next(run)
    state = json.loads(json.dumps(run.state_dict()))  # survives a trip through a checkpoint file
    expected = [next(run) for _ in range(8)]
    resumed = Batches(ds, batch_size=4, seq_len=T, seed=1)
    resumed.load_state_dict(state)
    for (x, y), (rx, ry) in zip(expected, (next(resumed) for _ in range(8))):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    start = Batches(ds, batch_size=4, seq_len=T, seed=1, start_step=state["step"])
    assert torch.equal(next(start)[0], expected[0][0])


def test_ranks_read_disjoint_data_and_rebuild_the_global_batch(ds):
    n, world = ds.num_sequences(T), 4
    single = Batches(ds, batch_size=8, seq_len=T, seed=2)
    ranks = [Batches(ds, batch_size=2, seq_len=T, seed=2, rank=r, world_size=world) for r in range(world)]
    for step in range(n // 8 + 2):
        ids = [r.sequence_ids(step) for r in ranks]
        flat = np.concatenate(ids)
        if (step + 1) * 8 <= n:  # within one epoch: no window twice
            assert len(set(flat.tolist())) == 8
        np.testing.assert_array_equal(flat, single.sequence_ids(step))


@pytest.mark.parametrize("world", [2, 4])
def test_same_global_batch_for_any_world_size(ds, world):
    B = 8
    single = Batches(ds, batch_size=B, seq_len=T, seed=3, return_resets=True)
    ranks = [Batches(ds, batch_size=B // world, seq_len=T, seed=3, rank=r, world_size=world, return_resets=True)
             for r in range(world)]
    for _ in range(ds.num_sequences(T) // B + 2):
        x, y, resets = next(single)
        parts = [next(r) for r in ranks]
        assert torch.equal(x, torch.cat([p[0] for p in parts]))
        assert torch.equal(y, torch.cat([p[1] for p in parts]))
        assert torch.equal(resets, torch.cat([p[2] for p in parts]))


def test_resume_with_another_world_size_but_the_same_global_batch(ds):
    run = Batches(ds, batch_size=4, seq_len=T, seed=9)
    for _ in range(3):
        next(run)
    state = run.state_dict()
    x_next = next(run)[0]
    halves = [Batches(ds, batch_size=2, seq_len=T, seed=9, rank=r, world_size=2) for r in range(2)]
    for h in halves:
        h.load_state_dict(state)
    assert torch.equal(torch.cat([next(h)[0] for h in halves]), x_next)
    with pytest.raises(DataError, match="global_batch_size is 4 but this run has 6"):
        Batches(ds, batch_size=3, seq_len=T, seed=9, world_size=2).load_state_dict(state)
    with pytest.raises(DataError, match="seed is 9 but this run has 10"):
        Batches(ds, batch_size=4, seq_len=T, seed=10).load_state_dict(state)


def test_resets_mark_document_starts(ds):
    batches = Batches(ds, batch_size=4, seq_len=T, seed=0, return_resets=True)
    inner = 0
    for step in range(ds.num_sequences(T) // 4):
        x, _, resets = batches.batch(step)
        assert resets[:, 0].all()
        expected = x[:, :-1] == ds.eos_id
        assert torch.equal(resets[:, 1:], expected)
        inner += int(expected.sum())
    assert inner > 0.9 * (ds.read(0, len(ds)) == ds.eos_id).sum()  # nearly every document start is marked


def test_seq_len_longer_than_the_data(ds):
    n = len(ds)
    Batches(ds, batch_size=1, seq_len=n - 1)  # exactly one window fits
    with pytest.raises(DataError) as err:
        Batches(ds, batch_size=1, seq_len=n)
    assert f"seq_len={n} needs at least {n + 1} tokens" in str(err.value) and f"has {n}" in str(err.value)


def test_empty_split_says_how_to_get_one(prepared):
    with pytest.raises(DataError, match="split 'val' of .* is empty \\(prepared with val_fraction=0.0\\)"):
        Batches(TokenDataset(prepared, "val"), batch_size=1, seq_len=T)


def test_pickles_as_a_path(ds):
    import pickle

    blob = pickle.dumps(ds)
    assert len(blob) < 1000 < len(ds)
    again = pickle.loads(blob)
    np.testing.assert_array_equal(again.read(0, len(ds)), ds.read(0, len(ds)))


def test_bad_arguments(ds):
    for kwargs in (dict(rank=2, world_size=2), dict(rank=-1), dict(batch_size=0), dict(world_size=0),
                   dict(start_step=-1)):
        with pytest.raises(ConfigError):
            Batches(ds, **{"batch_size": 2, "seq_len": T, **kwargs})


def test_damaged_or_missing_directories(prepared, tmp_path, corpus_dir, tiny_tokenizer):
    with pytest.raises(DataError, match="no meta.json"):
        TokenDataset(tmp_path)
    with pytest.raises(DataError, match="no split 'test'; choose from 'train', 'val'"):
        TokenDataset(prepared, "test")
    out = tmp_path / "copy"
    prepare(corpus_dir, tiny_tokenizer, out, val_fraction=0.0, shard_tokens=1000, split_chars=400, progress=False)
    shard = out / "train" / "000001.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    TokenDataset(out)  # same size: only the checksum can tell
    with pytest.raises(DataError, match="do not match their sha256"):
        TokenDataset(out, verify=True)
    shard.write_bytes(bytes(data[:-2]))
    with pytest.raises(DataError, match=r"000001\.bin: expected 2000 bytes \(1000 tokens\), found 1998"):
        TokenDataset(out)


def test_validation_split_and_tokenizer_from_the_directory(corpus_dir, tiny_tokenizer, tmp_path):
    prepare(corpus_dir, tiny_tokenizer, tmp_path / "out", val_fraction=0.2, shard_tokens=1000, split_chars=400,
            progress=False)
    val = TokenDataset(tmp_path / "out", "val")
    assert 0 < len(val) < len(TokenDataset(tmp_path / "out", "train"))
    assert val.tokenizer().fingerprint() == tiny_tokenizer.fingerprint()
    x, y = next(Batches(val, batch_size=2, seq_len=T, shuffle=False))
    np.testing.assert_array_equal(x[0].numpy(), val.read(0, T))
