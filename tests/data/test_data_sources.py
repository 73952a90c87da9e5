"""Sources: files, directories, globs, JSON lines, Parquet, hf: specs, bad UTF-8, and bad input."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from linlm.data.sources import decode_utf8, iter_texts, open_source, parse_hf_spec
from linlm.errors import DataError


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def test_text_file_is_one_document(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("line one\n\n  line two 🎉\n", encoding="utf-8")
    assert list(iter_texts(path)) == ["line one\n\n  line two 🎉\n"]
    assert list(iter_texts(str(path))) == ["line one\n\n  line two 🎉\n"]


def test_directory_recursive_sorted_with_supported_extensions(tmp_path):
    (tmp_path / "b.txt").write_text("B")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "z.md").write_text("AZ")
    _write_jsonl(tmp_path / "a" / "y.jsonl", [{"text": "AY1"}, {"text": "AY2"}])
    (tmp_path / "c.py").write_text("print('code is skipped')")
    (tmp_path / ".hidden.txt").write_text("hidden files are skipped")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x.txt").write_text("hidden dirs are skipped")
    source = open_source(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in source.files] == ["a/y.jsonl", "a/z.md", "b.txt"]
    assert list(source) == ["AY1", "AY2", "AZ", "B"]
    assert source.stats.documents == 4
    assert source.total_bytes == sum(p.stat().st_size for p in source.files)
    assert source.bytes_read == source.total_bytes


def test_glob(tmp_path):
    for name in ["x2.txt", "x1.txt", "y.txt", "x3.csv"]:
        (tmp_path / name).write_text(name)
    assert list(iter_texts(str(tmp_path / "x*"))) == ["x1.txt", "x2.txt"]
    with pytest.raises(DataError, match="matches no files with a supported extension"):
        open_source(str(tmp_path / "*.csv"))


def test_jsonl_and_json_array_with_a_named_field(tmp_path):
    _write_jsonl(tmp_path / "d.jsonl", [{"body": "one", "id": 1}, {"body": "two ✓"}])
    assert list(iter_texts(tmp_path / "d.jsonl", text_field="body")) == ["one", "two ✓"]
    (tmp_path / "arr.json").write_text(json.dumps([{"text": "first"}, {"text": "second"}]))
    assert list(iter_texts(tmp_path / "arr.json")) == ["first", "second"]


def test_jsonl_missing_field_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": "ok too"}\n{"content": "no text field"}\n')
    with pytest.raises(DataError) as err:
        list(iter_texts(path))
    msg = str(err.value)
    assert f"{path}:4" in msg and "'text'" in msg and "'content'" in msg and "--text-field" in msg


def test_jsonl_bad_json_and_wrong_types_name_the_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "unterminated}\n')
    with pytest.raises(DataError, match=r"broken\.jsonl:2: invalid JSON"):
        list(iter_texts(path))
    path.write_text('{"text": "ok"}\n{"text": null}\n')
    with pytest.raises(DataError, match=r"broken\.jsonl:2: field 'text' is null, expected a string"):
        list(iter_texts(path))
    path.write_text('{"text": "ok"}\n{"text": 3}\n')
    with pytest.raises(DataError, match=r"broken\.jsonl:2: field 'text' is int, expected a string"):
        list(iter_texts(path))
    path.write_text('["not", "an", "object"]\n')
    with pytest.raises(DataError, match=r"broken\.jsonl:1: expected a JSON object"):
        list(iter_texts(path))
    (tmp_path / "arr.json").write_text(json.dumps([{"text": "a"}, {"txt": "b"}]))
    with pytest.raises(DataError, match=r"arr\.json: record 2: no field 'text'"):
        list(iter_texts(tmp_path / "arr.json"))


def test_parquet_column_and_missing_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = [f"row {i} ∂" for i in range(2500)]
    pq.write_table(pa.table({"content": texts, "n": list(range(2500))}), tmp_path / "t.parquet", row_group_size=1000)
    source = open_source(tmp_path / "t.parquet", text_field="content")
    assert list(source) == texts
    assert source.bytes_read == source.total_bytes
    with pytest.raises(DataError) as err:
        list(iter_texts(tmp_path / "t.parquet"))
    assert "t.parquet" in str(err.value) and "no column 'text'" in str(err.value) and "'content'" in str(err.value)
    with pytest.raises(DataError, match="column 'n' has type int64"):
        list(iter_texts(tmp_path / "t.parquet", text_field="n"))
    pq.write_table(pa.table({"text": ["a", None, "c"]}), tmp_path / "nulls.parquet")
    with pytest.raises(DataError, match=r"nulls\.parquet: row 2: column 'text' is null"):
        list(iter_texts(tmp_path / "nulls.parquet"))


def test_invalid_utf8_is_replaced_and_counted(tmp_path, caplog):
    raw = b"ok \xff\xfe bad, a genuine \xef\xbf\xbd stays, truncated \xe2\x82 end"
    text, count = decode_utf8(raw)
    assert count == 3  # \xff, \xfe and the truncated 3-byte sequence; the genuine U+FFFD is not counted
    assert text.count("\ufffd") == 4
    (tmp_path / "a.txt").write_bytes(raw)
    _write_jsonl(tmp_path / "b.jsonl", [{"text": "clean"}])
    with open(tmp_path / "b.jsonl", "ab") as f:
        f.write(b'{"text": "latin-1 caf\xe9"}\n')
    source = open_source(tmp_path)
    with caplog.at_level(logging.WARNING, logger="linlm.data"):
        docs = list(source)
    assert docs[0] == text and docs[2] == "latin-1 caf\ufffd"
    assert source.stats.replacements == 4
    assert source.stats.files_with_replacements == 2
    assert any("3 invalid UTF-8" in r.getMessage() and "a.txt" in r.getMessage() for r in caplog.records)
    assert any("4 invalid UTF-8 sequences replaced" in r.getMessage() for r in caplog.records)


def test_lone_surrogates_from_json_escapes_are_replaced_and_counted(tmp_path, tiny_tokenizer):
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "pair \\ud83d\\ude00 ok, lone \\ud800 and \\udfff"}\n')
    source = open_source(path)
    assert list(source) == ["pair 😀 ok, lone \ufffd and \ufffd"]
    assert source.stats.replacements == 2


def test_empty_corpus_is_a_data_error(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.md").write_text("  \n\t\n")
    _write_jsonl(tmp_path / "e.jsonl", [{"text": ""}])
    source = open_source(tmp_path)
    with pytest.raises(DataError, match="is empty") as err:
        list(source)
    assert "3 empty or whitespace-only" in str(err.value)
    (tmp_path / "sub").mkdir()
    with pytest.raises(DataError, match="holds no files with a supported extension"):
        open_source(tmp_path / "sub")


def test_empty_documents_are_skipped_and_counted(tmp_path):
    _write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}, {"text": " "}, {"text": "b"}])
    source = open_source(tmp_path / "d.jsonl")
    assert list(source) == ["a", "b"]
    assert (source.stats.documents, source.stats.empty_documents) == (2, 1)


def test_unknown_source_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        open_source(tmp_path / "nope.txt")


def test_fingerprint_follows_content_not_location(tmp_path):
    for d in ("one", "two"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "a.txt").write_text("same")
    assert open_source(tmp_path / "one").fingerprint() == open_source(tmp_path / "two").fingerprint()
    (tmp_path / "two" / "a.txt").write_text("different")
    assert open_source(tmp_path / "one").fingerprint() != open_source(tmp_path / "two").fingerprint()
    assert (open_source(tmp_path / "one").fingerprint()
            != open_source(tmp_path / "one", text_field="body").fingerprint())


def test_parse_hf_spec():
    assert parse_hf_spec("hf:wikitext") == ("wikitext", None, "train")
    assert parse_hf_spec("hf:wikitext:wikitext-2-raw-v1@validation") == ("wikitext", "wikitext-2-raw-v1",
                                                                         "validation")
    assert parse_hf_spec("hf:org/name@test") == ("org/name", None, "test")
    for bad in ("hf:", "hf:name@", "hf:name:@train"):
        with pytest.raises(DataError, match="expected hf:NAME"):
            parse_hf_spec(bad)


def test_hf_without_datasets_installed_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(DataError, match=r"needs the optional `datasets` package: pip install 'linlm\[data\]'"):
        list(iter_texts("hf:some/dataset"))


def test_hf_streams_local_files(tmp_path, monkeypatch):
    pytest.importorskip("datasets", reason="the optional `datasets` package is not installed (extra: data)")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    data = tmp_path / "mydata"
    data.mkdir()
    _write_jsonl(data / "train.jsonl", [{"text": "hello"}, {"text": "world 🌍"}])
    _write_jsonl(data / "validation.jsonl", [{"text": "held out"}])
    assert list(iter_texts(f"hf:{data}")) == ["hello", "world 🌍"]
    assert list(iter_texts(f"hf:{data}@validation")) == ["held out"]
    assert list(iter_texts("hf:json", hf_kwargs={"data_files": str(data / "train.jsonl")})) == ["hello", "world 🌍"]
    before = open_source(f"hf:{data}").fingerprint()
    _write_jsonl(data / "train.jsonl", [{"text": "hello"}, {"text": "changed"}])
    assert open_source(f"hf:{data}").fingerprint() != before  # a local dataset is fingerprinted by content
    with pytest.raises(DataError, match="Bad split|nosuch"):
        list(iter_texts(f"hf:{data}@nosuch"))
    _write_jsonl(tmp_path / "bad.jsonl", [{"text": "ok"}, {"body": "x"}])
    with pytest.raises(DataError, match="record 2: field 'text' is null or missing"):
        list(iter_texts("hf:json", hf_kwargs={"data_files": str(tmp_path / "bad.jsonl")}))
    _write_jsonl(tmp_path / "other.jsonl", [{"body": "x"}])
    with pytest.raises(DataError, match="no field 'text' \\(fields: 'body'\\)"):
        list(iter_texts("hf:json", hf_kwargs={"data_files": str(tmp_path / "other.jsonl")}))


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_hf_malformed_local_files_are_one_line_data_errors(tmp_path, monkeypatch, kind):
    pytest.importorskip("datasets", reason="the optional `datasets` package is not installed (extra: data)")
    import os
    import subprocess
    from pathlib import Path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    data = tmp_path / "broken"
    data.mkdir()
    if kind == "jsonl":
        (data / "train.jsonl").write_text('{"text": "ok"}\n{"text": broken\n')
    else:
        (data / "train.parquet").write_bytes(b"this is not a parquet file")
    with pytest.raises(DataError, match=rf"source 'hf:{data}': cannot (read|load) dataset"):
        list(iter_texts(f"hf:{data}"))
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "linlm", "data", "prepare", "--source", f"hf:{data}", "--tokenizer",
                           "bpe:300", "--out", str(tmp_path / "out"), "--no-progress"], env=env, capture_output=True,
                          text=True)
    ours = [line for line in proc.stderr.splitlines() if line.startswith("linlm: error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(ours) == 1 and f"hf:{data}" in ours[0]
