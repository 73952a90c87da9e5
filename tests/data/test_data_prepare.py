"""prepare(): round trips, the split rule, resuming after a kill, refusing other outputs, and bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from linlm import outputs
from linlm.data.pieces import is_val_piece, iter_pieces, split_offset
from linlm.data.prepare import prepare
from linlm.data.shards import META_FILE, PROGRESS_DIR, token_dtype
from linlm.data.tokenizer import EOS_TOKEN, Tokenizer
from linlm.errors import ConfigError, DataError

SMALL = dict(shard_tokens=2000, split_chars=400, progress=False)


def _tokens(out: Path, split: str) -> np.ndarray:
    meta = json.loads((out / META_FILE).read_text())
    parts = [np.fromfile(out / s["file"], dtype=meta["dtype"]) for s in meta["splits"][split]["shards"]]
    return np.concatenate(parts) if parts else np.empty(0, dtype=meta["dtype"])


def _files(out: Path) -> dict[str, bytes]:
    """Every file's bytes, linlm's bookkeeping aside (the ledgers record modification times, the lock a PID)."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and not outputs.bookkeeping(p.name)}


def test_round_trip_text_to_shards_to_text(corpus_dir, docs, tiny_tokenizer, tmp_path):
    meta = prepare(corpus_dir, tiny_tokenizer, tmp_path / "out", val_fraction=0.0, **SMALL)
    out = tmp_path / "out"
    tokens = _tokens(out, "train")
    assert tokens.dtype == np.uint16 and meta["dtype"] == "uint16"
    assert tiny_tokenizer.decode(tokens) == "".join(d + EOS_TOKEN for d in docs)
    assert (tokens == tiny_tokenizer.eos_id).sum() == len(docs)
    assert meta["splits"]["train"]["tokens"] == len(tokens)
    assert meta["splits"]["val"] == {"tokens": 0, "pieces": 0, "shards": []}
    assert [s["tokens"] for s in meta["splits"]["train"]["shards"][:-1]] == [2000] * (len(tokens) // 2000)
    assert meta["source"]["documents"] == len(docs)
    assert meta["tokenizer"]["fingerprint"] == tiny_tokenizer.fingerprint()
    assert Tokenizer.from_pretrained(out).fingerprint() == tiny_tokenizer.fingerprint()
    assert json.loads((out / META_FILE).read_text()) == meta
    assert not (out / PROGRESS_DIR).exists()


def test_pieces_cut_at_newlines_and_rebuild_the_document():
    doc = "".join(f"line {i} " * (i % 7) + "\n" for i in range(300)) + "x" * 1000
    pieces = list(iter_pieces([doc, "short"], 100))
    assert "".join(p for p, _ in pieces[:-1]) == doc
    assert [last for _, last in pieces].count(True) == 2 and pieces[-2][1] and pieces[-1] == ("short", True)
    assert all(0 < len(p) <= 100 for p, _ in pieces)
    assert all(p.endswith("\n") for p, _ in pieces[:-11])
    assert [p for p, _ in pieces[-11:-1]] == ["x" * 100] * 10  # no newline in the last 1000 characters: hard cuts


@pytest.mark.parametrize("fraction", [0.005, 0.1, 0.37])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_split_rule_takes_an_exact_evenly_spread_sample(fraction, seed):
    u = split_offset(seed)
    for n in (1, 10, 199, 1000, 12345):
        chosen = [j for j in range(n) if is_val_piece(j, fraction, u)]
        assert len(chosen) == math.floor(n * fraction + u)
    gaps = np.diff([j for j in range(5000) if is_val_piece(j, fraction, u)])
    assert gaps.min() >= math.floor(1 / fraction) and gaps.max() <= math.ceil(1 / fraction)


def test_split_is_deterministic_and_complete(corpus_dir, docs, tiny_tokenizer, tmp_path):
    a = prepare(corpus_dir, tiny_tokenizer, tmp_path / "a", val_fraction=0.1, seed=3, **SMALL)
    b = prepare(corpus_dir, tiny_tokenizer, tmp_path / "b", val_fraction=0.1, seed=3, num_workers=1, **SMALL)
    c = prepare(corpus_dir, tiny_tokenizer, tmp_path / "c", val_fraction=0.1, seed=4, **SMALL)
    full = prepare(corpus_dir, tiny_tokenizer, tmp_path / "full", val_fraction=0.0, **SMALL)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")  # same seed, 1 or 2 workers: same bytes
    pieces = a["splits"]["train"]["pieces"] + a["splits"]["val"]["pieces"]
    assert a["splits"]["val"]["pieces"] == math.floor(pieces * 0.1 + split_offset(3))
    # Every token lands in exactly one split: the counts add up to the unsplit run.
    assert a["splits"]["train"]["tokens"] + a["splits"]["val"]["tokens"] == full["splits"]["train"]["tokens"]
    assert not np.array_equal(_tokens(tmp_path / "a", "val"), _tokens(tmp_path / "c", "val"))
    # Each split decodes to its pieces in corpus order, with EOS after a document's last piece only.
    expected = {"train": "", "val": ""}
    for j, (piece, last) in enumerate(iter_pieces(docs, SMALL["split_chars"])):
        split = "val" if is_val_piece(j, 0.1, split_offset(3)) else "train"
        expected[split] += piece + (EOS_TOKEN if last else "")
    for split in ("train", "val"):
        assert tiny_tokenizer.decode(_tokens(tmp_path / "a", split)) == expected[split]


KILL_AFTER_COMMIT = """
seen = []
def die(split, shard):
    seen.append(shard)
    if len(seen) == 3:
        os._exit(17)
"""
KILL_BEFORE_COMMIT = """
import linlm.data.prepare as p
commits = []
def commit(out, state):
    commits.append(state)
    if len(commits) == 4:  # the first commit is the empty start state: die before recording shards 3+
        os._exit(17)
    real_commit(out, state)
real_commit, p._commit_state = p._commit_state, commit
die = None
"""


@pytest.mark.parametrize("kill", [KILL_AFTER_COMMIT, KILL_BEFORE_COMMIT], ids=["after-commit", "before-commit"])
def test_resume_after_kill_is_byte_identical(corpus_dir, tiny_tokenizer, tmp_path, kill):
    """A real kill (os._exit in a child process, no cleanup) mid-run, then a re-run to completion."""
    tok_dir = tmp_path / "tok"
    tiny_tokenizer.save(tok_dir)
    reference = prepare(corpus_dir, tiny_tokenizer, tmp_path / "ref", val_fraction=0.05, **SMALL)
    assert len(reference["splits"]["train"]["shards"]) > 5
    out = tmp_path / "killed"
    script = "import os\nfrom linlm.data.prepare import prepare\n" + kill + textwrap.dedent(f"""
        prepare({str(corpus_dir)!r}, {str(tok_dir)!r}, {str(out)!r}, val_fraction=0.05, shard_tokens=2000,
                split_chars=400, progress=False, on_shard=die)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 17, proc.stderr
    assert not (out / META_FILE).exists() and (out / PROGRESS_DIR / "state.json").exists()
    state = json.loads((out / PROGRESS_DIR / "state.json").read_text())
    assert sum(len(s["shards"]) for s in state["splits"].values()) >= 2
    # What a kill in the middle of a write leaves: a temporary file, and a shard that linlm wrote (its ledger lists
    # it) but the state does not record. Beside them, a file of the user's, which the resumed run keeps.
    (out / "train" / f".000009.bin.{'0123abcd' * 4}.tmp").write_bytes(b"partial")
    outputs.write_bytes(out / "train" / "000042.bin", b"unrecorded")
    (out / "train" / "my-notes.txt").write_text("the user's")

    encoded = []
    original = Tokenizer.encode_batch
    resumed_with = Tokenizer.from_pretrained(tok_dir)
    resumed_with.encode_batch = lambda texts: encoded.extend(texts) or original(resumed_with, texts)
    meta = prepare(corpus_dir, resumed_with, out, val_fraction=0.05, **SMALL)
    assert (out / "train" / "my-notes.txt").read_text() == "the user's"
    (out / "train" / "my-notes.txt").unlink()
    assert _files(out) == _files(tmp_path / "ref")
    assert meta == reference
    # The resumed run did not tokenise again what the killed one had committed.
    assert 0 < sum(map(len, encoded)) < reference["source"]["bytes"] * 0.9


def test_resume_after_exception_with_a_trained_bpe(corpus_dir, tmp_path, monkeypatch):
    """bpe:N trains once; an interrupted run reuses that tokenizer and ends identical to an uninterrupted one."""
    kwargs = dict(val_fraction=0.05, **SMALL)
    reference = prepare(corpus_dir, "bpe:280", tmp_path / "ref", **kwargs)

    class Killed(Exception):
        pass

    def kill_after_two(split, shard, seen=[]):
        seen.append(shard)
        if len(seen) == 2:
            raise Killed

    with pytest.raises(Killed):
        prepare(corpus_dir, "bpe:280", tmp_path / "out", on_shard=kill_after_two, **kwargs)
    assert not (tmp_path / "out" / META_FILE).exists()
    monkeypatch.setattr(Tokenizer, "train", lambda *a, **k: pytest.fail("the resumed run trained the BPE again"))
    meta = prepare(corpus_dir, "bpe:280", tmp_path / "out", **kwargs)
    assert _files(tmp_path / "out") == _files(tmp_path / "ref")
    assert meta == reference and meta["vocab_size"] == 280


def test_a_complete_directory_is_a_no_op(corpus_dir, tiny_tokenizer, tmp_path, monkeypatch):
    out = tmp_path / "out"
    meta = prepare(corpus_dir, tiny_tokenizer, out, **SMALL)
    data_files = lambda: {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".lock"}  # noqa: E731
    before = data_files()  # (the lock file notes each holder's PID)
    monkeypatch.setattr(Tokenizer, "encode_batch", lambda *a: pytest.fail("a complete directory was re-tokenised"))
    assert prepare(corpus_dir, tiny_tokenizer, out, **SMALL) == meta
    assert data_files() == before


def test_a_different_source_or_tokenizer_is_refused(corpus_dir, tiny_tokenizer, docs, tmp_path):
    out = tmp_path / "out"
    prepare(corpus_dir, tiny_tokenizer, out, **SMALL)
    other_corpus = tmp_path / "other"
    other_corpus.mkdir()
    (other_corpus / "x.txt").write_text("something else entirely\n")
    with pytest.raises(DataError, match="different source_fingerprint") as err:
        prepare(other_corpus, tiny_tokenizer, out, **SMALL)
    assert str(out) in str(err.value) and "--overwrite" in str(err.value)
    other_tok = Tokenizer.train(docs, 270)
    with pytest.raises(DataError, match="different tokenizer"):
        prepare(corpus_dir, other_tok, out, **SMALL)
    with pytest.raises(DataError, match=r"different val_fraction \(was val_fraction=0.005.*now val_fraction=0.2"):
        prepare(corpus_dir, tiny_tokenizer, out, **{**SMALL, "val_fraction": 0.2})
    # Refusals change nothing; overwrite=True replaces the output with exactly a fresh run's.
    assert _tokens(out, "train").size > 0
    prepare(other_corpus, other_tok, out, overwrite=True, **SMALL)
    prepare(other_corpus, other_tok, tmp_path / "fresh", **SMALL)
    assert _files(out) == _files(tmp_path / "fresh")


def test_an_interrupted_directory_of_another_config_is_refused(corpus_dir, tiny_tokenizer, tmp_path):
    out = tmp_path / "out"

    def stop(split, shard):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare(corpus_dir, tiny_tokenizer, out, on_shard=stop, **SMALL)
    with pytest.raises(DataError, match="different seed"):
        prepare(corpus_dir, tiny_tokenizer, out, seed=5, **SMALL)


def test_a_foreign_directory_is_refused(corpus_dir, tiny_tokenizer, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my own file")
    with pytest.raises(DataError, match="was not made by `linlm data prepare`"):
        prepare(corpus_dir, tiny_tokenizer, out, **SMALL)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]  # refused before anything, a lock file included
    prepare(corpus_dir, tiny_tokenizer, out, overwrite=True, **SMALL)
    assert (out / "notes.txt").read_text() == "my own file"  # overwrite removes only our own files
    assert (out / META_FILE).exists()


def test_empty_corpus_leaves_nothing_behind(tmp_path, tiny_tokenizer):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "blank.txt").write_text("\n\n   \n")
    for tok in (tiny_tokenizer, "bpe:300"):
        with pytest.raises(DataError, match="is empty"):
            prepare(tmp_path / "src", tok, tmp_path / "out", **SMALL)
        assert not (tmp_path / "out").exists()


def test_bad_jsonl_names_the_line_and_leaves_no_output(tmp_path, tiny_tokenizer):
    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "fine"}\n{"text": "also fine"}\n{"txt": "typo"}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:3: no field 'text'"):
        prepare(src, tiny_tokenizer, tmp_path / "out", **SMALL)
    assert not (tmp_path / "out").exists()


def test_utf8_replacements_are_recorded(tmp_path, tiny_tokenizer):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_bytes(b"caf\xe9 and \xff\xfe, then good text\n")
    meta = prepare(tmp_path / "src", tiny_tokenizer, tmp_path / "out", val_fraction=0.0, **SMALL)
    assert meta["source"]["utf8_replacements"] == 3
    assert tiny_tokenizer.decode(_tokens(tmp_path / "out", "train")) == (
        "caf\ufffd and \ufffd\ufffd, then good text\n" + EOS_TOKEN)


def test_bad_settings_are_config_errors(corpus_dir, tiny_tokenizer, tmp_path):
    for bad in (dict(val_fraction=1.0), dict(val_fraction=-0.1), dict(shard_tokens=0), dict(num_workers=0),
                dict(bpe_train_chars=0)):
        with pytest.raises(ConfigError):
            prepare(corpus_dir, tiny_tokenizer, tmp_path / "out", **{**SMALL, **bad})
    assert not (tmp_path / "out").exists()


def test_large_vocab_uses_uint32(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    vocab = {"[UNK]": 0, EOS_TOKEN: 1, **{f"w{i}": i + 2 for i in range(70000)}}
    backend = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = Tokenizer(backend)
    (tmp_path / "a.txt").write_text("w5 w69999 w65535 w65534 w70001")
    meta = prepare(tmp_path / "a.txt", tok, tmp_path / "out", val_fraction=0.0, **SMALL)
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 70002
    assert _tokens(tmp_path / "out", "train").tolist() == [7, 70001, 65537, 65536, 0, 1]


# ---- what is linlm's: --overwrite and the cleanups remove only what prepare wrote ----------------------------


def _state(root: Path) -> dict:
    """Every path under root, a file with its bytes (the ledgers included): what 'unchanged' compares."""
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def _users(root: Path, *prefixes: str) -> dict:
    return {k: v for k, v in _state(root).items() if k.startswith(prefixes)}


def test_overwrite_removes_only_what_prepare_wrote(corpus_dir, tiny_tokenizer, tmp_path):
    import shutil

    out = tmp_path / "out"
    prepare(corpus_dir, tiny_tokenizer, out, **SMALL)
    (out / "notes.txt").write_text("my notes\n")
    (out / "train" / "README.md").write_text("what these shards are\n")
    shutil.copytree(out / "train", out / "train_backup")  # a copy of linlm's folder under the user's name
    (out / "analysis").mkdir()
    (out / "analysis" / "counts.npy").write_bytes(b"the user's counts")
    users = ("notes.txt", "train/README.md", "train_backup", "analysis")
    before = _users(out, *users)
    prepare(corpus_dir, tiny_tokenizer, out, overwrite=True, **{**SMALL, "val_fraction": 0.2})
    assert _users(out, *users) == before
    prepare(corpus_dir, tiny_tokenizer, tmp_path / "fresh", **{**SMALL, "val_fraction": 0.2})
    mine = {k for k in _files(out) if k.startswith(users)}
    assert {k: v for k, v in _files(out).items() if k not in mine} == _files(tmp_path / "fresh")


def _replace(out: Path, rel: str) -> None:
    (out / rel).write_bytes(b"the user's version\n")


def _val_file(out: Path) -> None:
    import shutil

    shutil.rmtree(out / "val")
    (out / "val").write_text("a file of the user's named val\n")


PREPARE_BLOCKERS = {"meta.json": lambda out: _replace(out, "meta.json"),
                    "tokenizer.json": lambda out: _replace(out, "tokenizer.json"),
                    "train/000001.bin": lambda out: _replace(out, "train/000001.bin"),
                    "val": _val_file}


@pytest.mark.parametrize("blocker", list(PREPARE_BLOCKERS))
def test_a_users_file_where_prepare_writes_refuses_overwrite_and_changes_nothing(corpus_dir, tiny_tokenizer,
                                                                                 tmp_path, capsys, blocker):
    from linlm.cli import main

    tok_dir = tmp_path / "tok"
    tiny_tokenizer.save(tok_dir)
    out = tmp_path / "out"
    prepare(corpus_dir, tok_dir, out, **SMALL)
    PREPARE_BLOCKERS[blocker](out)
    before = _state(out)
    code = main(["data", "prepare", "--source", str(corpus_dir), "--tokenizer", str(tok_dir), "--out", str(out),
                 "--shard-tokens", "2000", "--split-chars", "400", "--seed", "9", "--overwrite", "--no-progress"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("linlm: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err and str(out / blocker) in errors[0], err
    assert _state(out) == before  # nothing removed, nothing written (the lock file notes the same process)


def test_a_users_file_in_progress_is_kept_through_resume_and_completion(corpus_dir, tiny_tokenizer, tmp_path):
    out = tmp_path / "out"

    def stop(split, shard):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare(corpus_dir, tiny_tokenizer, out, on_shard=stop, **SMALL)
    (out / PROGRESS_DIR / "mine.txt").write_text("the user's\n")
    meta = prepare(corpus_dir, tiny_tokenizer, out, **SMALL)
    assert (out / PROGRESS_DIR / "mine.txt").read_text() == "the user's\n"
    assert sorted(p.name for p in (out / PROGRESS_DIR).iterdir() if not outputs.bookkeeping(p.name)) == ["mine.txt"]
    assert meta == prepare(corpus_dir, tiny_tokenizer, tmp_path / "ref", **SMALL)


def test_every_file_prepare_writes_is_recorded_as_linlms(corpus_dir, tiny_tokenizer, tmp_path):
    out = tmp_path / "out"
    prepare(corpus_dir, tiny_tokenizer, out, **SMALL)
    files = [p for p in out.rglob("*") if p.is_file() and not outputs.bookkeeping(p.name)]
    assert files and all(outputs.owns_file(p) for p in files)
    assert all(outputs.owns_dir(out / d) for d in ("train", "val")) and outputs.owns_dir(out)
