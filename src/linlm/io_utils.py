"""Atomic file and directory writes, checksums and manifests.

Directories are replaced without ever removing what linlm did not write: :func:`commit_dir` swaps the new
directory in atomically and then deletes, from the old one, only the files its caller names as its own.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Iterable, Optional

from linlm.errors import CheckpointError

log = logging.getLogger("linlm")

MANIFEST = "manifest.json"


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fsync_path(path: str | Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write to a temporary file beside ``path``, fsync, then rename over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def temp_dir_beside(path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.mkdir()
    return tmp


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE). False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def remove_owned(directory: Path, owned: Iterable[str]) -> list[str]:
    """Delete the plain files named in ``owned`` from ``directory``, then the directory if nothing else is left.

    Returns the names left behind (never deleted: linlm did not write them).
    """
    for name in owned:
        f = directory / name
        if f.is_file() and not f.is_symlink():
            f.unlink()
    left = sorted(p.name for p in directory.iterdir())
    if not left:
        directory.rmdir()
    return left


def commit_dir(tmp: Path, path: str | Path, owned: Optional[Iterable[str]] = None) -> None:
    """Put the finished directory ``tmp`` at ``path`` (every file fsynced first).

    - ``path`` absent, or an empty directory: ``tmp`` is renamed into place.
    - ``path`` a directory: the two are swapped in one step where the system allows it (Linux), else by two
      renames; then only the files named in ``owned`` (default: the names ``tmp`` holds) are deleted from the old
      directory. Anything else in it is kept in ``.NAME.<id>.old`` beside ``path`` and named in a warning.
    - ``path`` a file: OSError (NotADirectoryError), and nothing changes.

    An error is raised only before anything has moved; once ``tmp`` is in place, a failure to clean the old
    directory is a warning.
    """
    path = Path(path)
    names = sorted(p.name for p in tmp.iterdir())
    owned = set(names if owned is None else owned)
    for child in tmp.iterdir():
        fsync_path(child)
    fsync_path(tmp)
    if path.is_dir() and not path.is_symlink() and any(path.iterdir()):
        old = path.with_name(f".{path.name}.{uuid.uuid4().hex}.old")
        if _exchange(tmp, path):
            try:
                os.replace(tmp, old)
            except OSError:
                old = tmp
        else:
            os.replace(path, old)
            try:
                os.replace(tmp, path)
            except OSError:
                os.replace(old, path)  # put the old directory back: nothing has changed
                raise
        try:
            fsync_path(path.parent)
            left = remove_owned(old, owned)
        except OSError as e:
            left = [f"({e})"]
        if left:
            log.warning("%s was replaced; the old directory held files linlm did not write (%s), kept in %s",
                        path, ", ".join(left[:5]), old)
        return
    os.replace(tmp, path)  # onto an empty directory, or a new name; refuses a file or a non-empty directory
    fsync_path(path.parent)


# ---- manifests: the sha256 and size of every file of a directory ---------------------------------------------


def file_digests(directory: str | Path) -> dict[str, dict]:
    """{name: {"bytes": size, "sha256": hex}} for every file in ``directory``."""
    directory = Path(directory)
    return {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(directory.iterdir()) if p.is_file()}


def verify_manifest(directory: str | Path, required: Iterable[str] = ()) -> dict:
    """Raise CheckpointError unless every file ``directory/manifest.json`` lists is there with its size and sha256.

    ``required``: names the manifest must list. Returns the manifest.
    """
    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{directory}: no {MANIFEST} (the checkpoint was not finished)")
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
        items = list(files.items())
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{manifest_path}: unreadable manifest ({e})") from None
    for name in required:
        if name not in files:
            raise CheckpointError(f"{directory}: the manifest does not list {name}")
    for name, info in items:
        file = directory / name
        if not file.is_file():
            raise CheckpointError(f"{file}: missing")
        size = file.stat().st_size
        if size != info.get("bytes"):
            raise CheckpointError(f"{file}: {size} bytes, the manifest says {info.get('bytes')} "
                                  f"(truncated or edited); restore the file, or use another checkpoint")
        if sha256_file(file) != info.get("sha256"):
            raise CheckpointError(f"{file}: sha256 differs from the manifest {manifest_path} (corrupt or edited); "
                                  f"restore the file, or use another checkpoint")
    return manifest
