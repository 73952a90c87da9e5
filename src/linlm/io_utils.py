"""Atomic file and directory writes, and checksums."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path


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


def commit_dir(tmp: Path, path: str | Path) -> None:
    """Replace directory ``path`` by the finished ``tmp`` (fsynced); the old one is removed only afterwards."""
    path = Path(path)
    for child in tmp.iterdir():
        fsync_path(child)
    fsync_path(tmp)
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.{uuid.uuid4().hex}.old")
        os.replace(path, old)
    os.replace(tmp, path)
    fsync_path(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
