"""The low-level pieces under :mod:`linlm.outputs`: checksums, fsync, one atomic file write, and manifests.

Commands never write through these directly: :mod:`linlm.outputs` checks that a path is linlm's first and
records what it wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Iterable, Optional

from linlm.errors import CheckpointError

MANIFEST = "manifest.json"


def sha256_file(path: str | Path, limit: Optional[int] = None, chunk: int = 1 << 20) -> str:
    """sha256 of a file (of its first ``limit`` bytes when given)."""
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as f:
        while left is None or left > 0:
            block = f.read(chunk if left is None else min(chunk, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
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
