"""Text sources: turn a source spec into a stream of documents (strings).

A source spec is one of (checked in this order):

=============================  ===============================================================================
``"shakespeare"``              the built-in corpus (:mod:`linlm.data.corpus`); one document per work.
``"hf:NAME[:CONFIG][@SPLIT]"`` a Hugging Face dataset, streamed with the optional ``datasets`` package; NAME may
                               be a hub name or a local directory/file that ``datasets.load_dataset`` accepts.
                               SPLIT defaults to ``train``. One document per record, text in ``text_field``.
an existing directory          every supported file below it, recursively, in sorted order of relative path;
                               names starting with ``.`` are skipped, as are files with other extensions.
an existing file               read by its extension (below); any other extension is read as plain text.
a glob (``*``, ``?``, ``[``)   the matching files (``**`` recurses), sorted, by extension; others are skipped.
=============================  ===============================================================================

Extensions: plain text ``.txt .md .markdown .rst .text`` (one document per file); JSON lines ``.jsonl .ndjson
.json`` (one document per line, the string in ``text_field``; a ``.json`` file whose first character is ``[`` is
read as one JSON array of records instead); Parquet ``.parquet`` (one document per row of column
``text_field``). Compressed files are not read.

Bytes that are not valid UTF-8 (and lone surrogates from JSON ``\\udXXX`` escapes) become U+FFFD replacement
characters; the number replaced is counted in :attr:`SourceStats.replacements` and logged. Documents that are
empty or only whitespace are skipped (and counted). A source that yields no document at all raises :class:`DataError`.
"""

from __future__ import annotations

import dataclasses
import glob as globlib
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from linlm.errors import DataError
from linlm.io_utils import sha256_file

log = logging.getLogger("linlm.data")

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".rst", ".text")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet",)
SUPPORTED_SUFFIXES = TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES
BUILTIN = "shakespeare"
_REPLACEMENT_WARNINGS = 10  # per-file warnings before only the total is logged

SourceLike = Union[str, os.PathLike, "Source"]


@dataclasses.dataclass
class SourceStats:
    """Counts gathered while a source is read."""

    documents: int = 0  # documents yielded
    empty_documents: int = 0  # skipped because empty or whitespace only
    bytes: int = 0  # UTF-8 bytes of the yielded documents
    replacements: int = 0  # invalid UTF-8 sequences replaced by U+FFFD
    files_with_replacements: int = 0


def decode_utf8(raw: bytes) -> tuple[str, int]:
    """Decode UTF-8, replacing invalid sequences with U+FFFD; returns the text and the number replaced."""
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        # A genuine U+FFFD is encoded as EF BF BD; every other U+FFFD in the result is a replacement.
        return text, text.count("\ufffd") - raw.count(b"\xef\xbf\xbd")


class Source:
    """A resolved source: iterate it for documents; ``total_bytes``/``bytes_read`` drive a progress bar.

    Iterating again restarts from the first document and resets :attr:`stats`.
    """

    def __init__(self, spec: str, kind: str, files: list[Path], *, text_field: str = "text",
                 hf: Optional[tuple[str, Optional[str], str]] = None, hf_kwargs: Optional[dict] = None,
                 root: Optional[Path] = None):
        self.spec = spec
        self.kind = kind  # "builtin" | "files" | "hf"
        self.files = files
        self.text_field = text_field
        self._hf = hf
        self._hf_kwargs = dict(hf_kwargs or {})
        self._root = root
        self.stats = SourceStats()
        self.bytes_read = 0
        self._fingerprint: Optional[str] = None

    def __repr__(self) -> str:
        return f"Source({self.spec!r}, kind={self.kind!r}, files={len(self.files)})"

    @property
    def total_bytes(self) -> Optional[int]:
        """Input bytes to read (sum of file sizes), or None when unknown (streamed datasets)."""
        if self.kind == "hf":
            return None
        return sum(p.stat().st_size for p in self.files)

    def fingerprint(self) -> str:
        """sha256 identifying the content: file names (relative to the source root), sizes and content hashes;
        for ``hf:`` sources the spec, text field and load arguments, plus the files when NAME is a local path
        (for a hub dataset, pin ``revision`` in ``hf_kwargs`` to make it exact)."""
        if self._fingerprint is None:
            if self.kind == "hf":
                ident: Any = {"hf": self.spec, "text_field": self.text_field, "kwargs": self._hf_kwargs}
                local = Path(self._hf[0]).expanduser()
                if local.exists():  # a local dataset: its content, as for files
                    files = sorted(p for p in ([local] if local.is_file() else local.rglob("*")) if p.is_file())
                    ident["files"] = [[p.relative_to(local).as_posix() if p != local else p.name,
                                       p.stat().st_size, sha256_file(p)] for p in files]
            else:
                ident = {"text_field": self.text_field,
                         "files": [[self._relname(p), p.stat().st_size, sha256_file(p)] for p in self.files]}
            blob = json.dumps(ident, sort_keys=True, default=str).encode()
            self._fingerprint = hashlib.sha256(blob).hexdigest()
        return self._fingerprint

    def _relname(self, path: Path) -> str:
        if self._root is not None:
            try:
                return path.relative_to(self._root).as_posix()
            except ValueError:
                pass
        return path.name

    def __iter__(self) -> Iterator[str]:
        self.stats = SourceStats()
        self.bytes_read = 0
        if self.kind == "hf":
            docs = self._iter_hf()
        else:
            docs = (doc for path in self.files for doc in self._iter_file(path))
        for doc in docs:
            if not doc.strip():
                self.stats.empty_documents += 1
                continue
            try:
                size = len(doc.encode("utf-8"))
            except UnicodeEncodeError:  # lone surrogates, e.g. from a JSON "\ud800" escape: not encodable text
                fixed = doc.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
                self._note_replacements(f"{self.spec} (document {self.stats.documents + 1})",
                                        fixed.count("\ufffd") - doc.count("\ufffd"))
                doc, size = fixed, len(fixed.encode("utf-8"))
            self.stats.documents += 1
            self.stats.bytes += size
            yield doc
        if self.stats.replacements:
            log.warning("%s: %d invalid UTF-8 sequences replaced by U+FFFD in %d files", self.spec,
                        self.stats.replacements, self.stats.files_with_replacements)
        if self.stats.documents == 0:
            where = f"{len(self.files)} file(s)" if self.kind != "hf" else "the dataset"
            raise DataError(f"source {self.spec!r} is empty: {where} gave no text "
                            f"({self.stats.empty_documents} empty or whitespace-only documents skipped). "
                            "Point --source at files that contain text.")

    # ---- readers -------------------------------------------------------------------------------------------

    def _note_replacements(self, where: str, count: int) -> None:
        if not count:
            return
        self.stats.replacements += count
        self.stats.files_with_replacements += 1
        if self.stats.files_with_replacements <= _REPLACEMENT_WARNINGS:
            log.warning("%s: %d invalid UTF-8 sequence(s) replaced by U+FFFD", where, count)

    def _iter_file(self, path: Path) -> Iterator[str]:
        suffix = path.suffix.lower()
        if suffix in PARQUET_SUFFIXES:
            yield from self._iter_parquet(path)
        elif suffix in JSONL_SUFFIXES:
            yield from self._iter_json(path)
        else:
            try:
                raw = path.read_bytes()
            except OSError as e:
                raise DataError(f"{path}: cannot read ({e.strerror})") from e
            text, n = decode_utf8(raw)
            self._note_replacements(str(path), n)
            self.bytes_read += len(raw)
            yield text

    def _record_text(self, record: Any, where: str) -> str:
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object with a {self.text_field!r} field, "
                            f"got {type(record).__name__}")
        if self.text_field not in record:
            fields = ", ".join(repr(k) for k in list(record)[:20]) or "none"
            raise DataError(f"{where}: no field {self.text_field!r} (fields: {fields}); "
                            "choose the field with --text-field / text_field=")
        value = record[self.text_field]
        if value is None:
            missing = " or missing" if self.kind == "hf" else ""  # datasets fills absent fields with None
            raise DataError(f"{where}: field {self.text_field!r} is null{missing}, expected a string")
        if not isinstance(value, str):
            raise DataError(f"{where}: field {self.text_field!r} is {type(value).__name__}, expected a string")
        return value

    def _iter_json(self, path: Path) -> Iterator[str]:
        try:
            f = open(path, "rb")
        except OSError as e:
            raise DataError(f"{path}: cannot read ({e.strerror})") from e
        with f:
            head = f.read(4096).lstrip()
            f.seek(0)
            if head.startswith(b"\xef\xbb\xbf"):
                head = head[3:].lstrip()
            if path.suffix.lower() == ".json" and head.startswith(b"["):
                yield from self._iter_json_array(path, f.read())
                return
            replaced = 0
            for lineno, line in enumerate(f, 1):
                self.bytes_read += len(line)
                if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
                    line = line[3:]
                if not line.strip():
                    continue
                text, n = decode_utf8(line)
                replaced += n
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg}, column {e.colno}); each line of a "
                                    "JSON-lines file must be one JSON object") from e
                yield self._record_text(record, f"{path}:{lineno}")
            self._note_replacements(str(path), replaced)

    def _iter_json_array(self, path: Path, raw: bytes) -> Iterator[str]:
        text, n = decode_utf8(raw)
        self._note_replacements(str(path), n)
        try:
            records = json.loads(text.lstrip("\ufeff"))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg}, column {e.colno})") from e
        self.bytes_read += len(raw)
        for i, record in enumerate(records, 1):
            yield self._record_text(record, f"{path}: record {i}")

    def _iter_parquet(self, path: Path) -> Iterator[str]:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as e:
            raise DataError(f"{path}: reading Parquet needs pyarrow: pip install 'linlm[data]'") from e
        try:
            pf = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{path}: not a readable Parquet file ({e})") from e
        names = pf.schema_arrow.names
        if self.text_field not in names:
            raise DataError(f"{path}: no column {self.text_field!r} (columns: {', '.join(map(repr, names))}); "
                            "choose the column with --text-field / text_field=")
        column_type = pf.schema_arrow.field(self.text_field).type
        if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
            raise DataError(f"{path}: column {self.text_field!r} has type {column_type}, expected a string column")
        size, rows = path.stat().st_size, max(pf.metadata.num_rows, 1)
        before, row = self.bytes_read, 0
        for batch in pf.iter_batches(columns=[self.text_field], batch_size=1024):
            for value in batch.column(0).to_pylist():
                row += 1
                if value is None:
                    raise DataError(f"{path}: row {row}: column {self.text_field!r} is null")
                yield value
            self.bytes_read = before + size * row // rows

    def check_reachable(self) -> None:
        """Refuse at once a hub dataset the hub cannot give now (:func:`linlm.data.hub_probe.check_hub_source`)."""
        if self.kind == "hf":
            from linlm.data.hub_probe import check_hub_source

            check_hub_source(self.spec, self._hf[0])

    def _iter_hf(self) -> Iterator[str]:
        try:
            import datasets
        except ImportError as e:
            raise DataError(f"source {self.spec!r} needs the optional `datasets` package: "
                            "pip install 'linlm[data]' (or pip install datasets)") from e
        name, config, split = self._hf
        unreadable = hf_read_errors(datasets)
        self.check_reachable()
        try:
            ds = datasets.load_dataset(name, config, split=split, streaming=True, **self._hf_kwargs)
        except (FileNotFoundError, ConnectionError, ValueError, *unreadable) as e:
            raise DataError(f"source {self.spec!r}: cannot load dataset {name!r} (config {config!r}, split "
                            f"{split!r}): {first_line(e)}") from e
        columns = getattr(ds, "column_names", None)
        if columns is not None and self.text_field not in columns:
            raise DataError(f"source {self.spec!r}: no field {self.text_field!r} (fields: "
                            f"{', '.join(map(repr, columns))}); choose the field with --text-field / text_field=")
        records = iter(ds)
        i = 0
        while True:
            try:
                record = next(records)
            except StopIteration:
                return
            except unreadable as e:  # a malformed file met while streaming (pyarrow's ArrowInvalid, ...)
                raise DataError(f"source {self.spec!r}: cannot read dataset {name!r} after {i} records: "
                                f"{first_line(e)}; fix or remove the malformed file") from e
            i += 1
            text = self._record_text(record, f"{self.spec}: record {i}")
            self.bytes_read += len(text)
            yield text


def hf_read_errors(datasets_module: Any) -> tuple[type, ...]:
    """The exceptions by which ``datasets`` (and pyarrow beneath it) report a malformed data file."""
    errors: list[type] = []
    generation = getattr(getattr(datasets_module, "exceptions", None), "DatasetGenerationError", None)
    if isinstance(generation, type):
        errors.append(generation)
    try:
        import pyarrow as pa

        errors.append(pa.ArrowException)
    except ImportError:
        pass
    return tuple(errors)


def first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def parse_hf_spec(spec: str) -> tuple[str, Optional[str], str]:
    """``hf:NAME[:CONFIG][@SPLIT]`` -> (name, config or None, split, default ``train``)."""
    body = spec[3:]
    split = "train"
    if "@" in body:
        body, split = body.rsplit("@", 1)
    name, config = body, None
    if ":" in body:
        name, config = body.split(":", 1)
    if not name or not split or config == "":
        raise DataError(f"source {spec!r}: expected hf:NAME[:CONFIG][@SPLIT], e.g. hf:wikitext:wikitext-2-raw-v1@train")
    return name, config, split


def open_source(source: SourceLike, *, text_field: str = "text", hf_kwargs: Optional[dict] = None) -> Source:
    """Resolve a source spec (see the module doc) without reading it yet."""
    if isinstance(source, Source):
        return source
    spec = os.fspath(source)
    if spec == BUILTIN:
        from linlm.data.corpus import builtin_corpus_files

        files = builtin_corpus_files()
        return Source(spec, "builtin", files, root=files[0].parent)
    if spec.startswith("hf:"):
        return Source(spec, "hf", [], text_field=text_field, hf=parse_hf_spec(spec), hf_kwargs=hf_kwargs)
    path = Path(spec).expanduser()
    if path.is_dir():
        files, skipped = _walk(path)
        if skipped:
            log.info("%s: skipped %d files with unsupported extensions", spec, skipped)
        if not files:
            raise DataError(f"source directory {spec!r} holds no files with a supported extension "
                            f"({' '.join(SUPPORTED_SUFFIXES)})")
        return Source(spec, "files", files, text_field=text_field, root=path)
    if path.is_file():
        return Source(spec, "files", [path], text_field=text_field, root=path.parent)
    if any(c in spec for c in "*?["):
        matches = sorted(Path(p) for p in globlib.glob(os.path.expanduser(spec), recursive=True))
        matches = [p for p in matches if p.is_file()]
        files = [p for p in matches if p.suffix.lower() in SUPPORTED_SUFFIXES]
        if not files:
            raise DataError(f"source glob {spec!r} matches no files with a supported extension "
                            f"({' '.join(SUPPORTED_SUFFIXES)}); it matched {len(matches)} other file(s)")
        root = Path(os.path.commonpath([str(p.parent) for p in files]))
        return Source(spec, "files", files, text_field=text_field, root=root)
    raise DataError(f"source {spec!r} not found: it is not an existing file or directory, a glob, "
                    f"{BUILTIN!r}, or hf:NAME[:CONFIG][@SPLIT]")


def iter_texts(source: SourceLike, *, text_field: str = "text", hf_kwargs: Optional[dict] = None) -> Iterator[str]:
    """Stream the documents of a source (see the module doc). For sizes and counts use :func:`open_source`."""
    return iter(open_source(source, text_field=text_field, hf_kwargs=hf_kwargs))


def _walk(root: Path) -> tuple[list[Path], int]:
    found: list[tuple[str, Path]] = []
    skipped = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            if path.suffix.lower() in SUPPORTED_SUFFIXES:
                found.append((path.relative_to(root).as_posix(), path))
            else:
                skipped += 1
    return [p for _, p in sorted(found)], skipped
