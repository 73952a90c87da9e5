"""The ledger: what linlm wrote in a directory, and whether a file or directory is linlm's (see linlm.outputs)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from linlm.io_utils import atomic_write_bytes, sha256_file
from linlm.locking import LOCK_FILE

LEDGER = ".linlm-files.json"
LEDGER_FORMAT = "linlm-files/1"
HEAD_BYTES = 4096  # an append-only log is recognised by the sha256 of its first bytes
_TEMP = re.compile(r"^\..+\.[0-9a-f]{32}\.(tmp|old)$")
PROBE = ".linlm-probe"


def bookkeeping(name: str) -> bool:
    """True for the names linlm keeps beside its outputs: the ledger, the lock file, its temporary files."""
    return name in (LEDGER, LOCK_FILE) or name.startswith(PROBE) or bool(_TEMP.match(name))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- the ledger --------------------------------------------------------------------------------------------------


@dataclass
class Ledger:
    """What one directory's ``.linlm-files.json`` says."""

    entries: dict[str, dict] = field(default_factory=dict)  # file name -> {bytes, mtime_ns, sha256 | head_sha256}
    created: bool = False  # linlm made this directory
    name: Optional[str] = None  # ... under this name

    def to_json(self) -> bytes:
        return (json.dumps({"format": LEDGER_FORMAT, "created": self.created, "name": self.name,
                            "entries": self.entries}, indent=1, sort_keys=True) + "\n").encode()


def _parse_ledger(text: bytes) -> Optional[Ledger]:
    try:
        data = json.loads(text.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("format") != LEDGER_FORMAT or not isinstance(data.get("entries"), dict):
        return None
    entries = {k: v for k, v in data["entries"].items() if isinstance(k, str) and isinstance(v, dict)}
    return Ledger(entries, bool(data.get("created")), data.get("name") if isinstance(data.get("name"), str) else None)


def has_ledger(directory: str | Path) -> bool:
    return (Path(directory) / LEDGER).is_file()


def read_ledger(directory: str | Path) -> Ledger:
    """The ledger of ``directory`` (empty when it has none or an unreadable one: then nothing there is linlm's)."""
    try:
        text = (Path(directory) / LEDGER).read_bytes()
    except OSError:
        return Ledger()
    return _parse_ledger(text) or Ledger()


@contextlib.contextmanager
def _locked_ledger(directory: Path) -> Iterator[tuple[int, Ledger]]:
    """Hold an exclusive flock on ``directory``'s ledger file (created empty if absent) and yield it, read.

    The ledger is replaced by rename, so a waiter that locked the old file looks again until the file it holds is
    the one in place."""
    import fcntl

    path = directory / LEDGER
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)
    try:
        chunks = []
        while block := os.read(fd, 1 << 16):
            chunks.append(block)
        text = b"".join(chunks)
        yield fd, (_parse_ledger(text) or Ledger()) if text.strip() else Ledger()
    finally:
        os.close(fd)


def update_ledger(directory: str | Path, changes: dict[str, Optional[dict]], *,
                  created: Optional[bool] = None) -> None:
    """Apply ``changes`` (name -> entry, or None to drop it) to ``directory``'s ledger, atomically and under its
    lock; ``created`` marks the directory as made by linlm (under its present name)."""
    directory = Path(directory)
    with _locked_ledger(directory) as (_, ledger):
        for name, entry in changes.items():
            if entry is None:
                ledger.entries.pop(name, None)
            else:
                ledger.entries[name] = entry
        if created:
            ledger.created, ledger.name = True, Path(os.path.abspath(directory)).name
        if not ledger.entries and not ledger.created:
            (directory / LEDGER).unlink()  # nothing of linlm's left here: no trace either
        else:
            atomic_write_bytes(directory / LEDGER, ledger.to_json())


def file_entry(path: Path, sha256: Optional[str] = None, *, append: bool = False) -> dict:
    """The ledger entry of a file linlm has just written (``sha256`` when known, else read back)."""
    st = path.stat()
    entry: dict[str, Any] = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    if append:
        entry["head_bytes"] = min(st.st_size, HEAD_BYTES)
        entry["head_sha256"] = sha256_file(path, limit=entry["head_bytes"])
    else:
        entry["sha256"] = sha256 or sha256_file(path)
    return entry


def record(path: str | Path, sha256: Optional[str] = None, *, append: bool = False) -> None:
    """Enter a file linlm has written at ``path`` (by any means) into its directory's ledger."""
    path = Path(path)
    update_ledger(path.parent, {path.name: file_entry(path, sha256, append=append)})


def stage(path: str | Path, entry: dict) -> None:
    """Record ``entry`` as the next version of ``path`` beside the one the ledger has now, before the new file is
    renamed into place: a kill at any moment then leaves ``path`` one of two recorded versions, never an unknown
    one. :func:`settle` keeps the new one alone once the rename is done."""
    path = Path(path)
    with_next = {k: v for k, v in read_ledger(path.parent).entries.get(path.name, {}).items() if k != "next"}
    update_ledger(path.parent, {path.name: {**with_next, "next": entry}})


def settle(path: str | Path, entry: dict) -> None:
    path = Path(path)
    update_ledger(path.parent, {path.name: entry})


def forget(path: str | Path) -> None:
    """Drop ``path`` from its directory's ledger (linlm removed or moved it)."""
    path = Path(path)
    if has_ledger(path.parent):
        update_ledger(path.parent, {path.name: None})


def seal(directory: str | Path, name: str, digests: Optional[dict[str, str]] = None) -> None:
    """Record every plain file of a directory linlm has just made and filled (a temporary directory about to be
    renamed into place) as linlm's, and the directory as made by linlm under its final ``name``. ``digests``:
    sha256 of files already hashed (a checkpoint's manifest)."""
    directory = Path(directory)
    digests = digests or {}
    entries = {p.name: file_entry(p, digests.get(p.name)) for p in sorted(directory.iterdir())
               if p.is_file() and not p.is_symlink() and not bookkeeping(p.name)}
    atomic_write_bytes(directory / LEDGER, Ledger(entries, True, name).to_json())


# ---- ownership ---------------------------------------------------------------------------------------------------


def _matches(path: Path, st: os.stat_result, entry: dict) -> bool:
    if "head_sha256" in entry:  # an append-only log: its beginning is what linlm wrote
        n = int(entry.get("head_bytes", 0))
        return st.st_size >= n and sha256_file(path, limit=n) == entry["head_sha256"]
    if "bytes" not in entry or st.st_size != entry["bytes"]:
        return False
    return st.st_mtime_ns == entry.get("mtime_ns") or sha256_file(path) == entry.get("sha256")


def owns_file(path: str | Path, ledger: Optional[Ledger] = None) -> bool:
    """True when ``path`` is a plain file that linlm wrote and nobody changed since (see the module doc)."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return False
    entry = (ledger or read_ledger(path.parent)).entries.get(path.name)
    if not entry:
        return False
    st = path.stat()
    return _matches(path, st, entry) or (isinstance(entry.get("next"), dict) and _matches(path, st, entry["next"]))


def read_own_json(path: str | Path) -> tuple[Optional[dict], Optional[str]]:
    """(the JSON object in a file linlm wrote, None), or (None, why not): "not linlm's" for a file linlm did not
    write or that was changed since, "unreadable" for one that holds no JSON object. For markers that say what a
    directory is (a job's, a sweep's): a file of the user's at that name never makes a directory linlm's."""
    path = Path(path)
    if not owns_file(path):
        return None, "not linlm's"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        data = None
    return (data, None) if isinstance(data, dict) else (None, "unreadable")


def owns_dir(path: str | Path) -> bool:
    """True when linlm made the directory ``path`` under the name it has now."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        return False
    ledger = read_ledger(path)
    return ledger.created and ledger.name == Path(os.path.abspath(path)).name


def foreign_entries(directory: str | Path) -> list[str]:
    """The names in ``directory`` that are not linlm's (neither its files, its directories nor its bookkeeping)."""
    directory = Path(directory)
    ledger = read_ledger(directory)
    out = []
    for p in sorted(directory.iterdir()):
        if bookkeeping(p.name):
            continue
        if p.is_dir() and not p.is_symlink():
            if not owns_dir(p):
                out.append(p.name + "/")
        elif not owns_file(p, ledger):
            out.append(p.name)
    return out
