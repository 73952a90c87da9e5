"""Checks before any work, and every write of a file (see linlm.outputs)."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

from linlm.errors import OutputError, StorageError
from linlm.io_utils import fsync_path
from linlm.outputs.ledger import (HEAD_BYTES, PROBE, bookkeeping, file_entry, foreign_entries, has_ledger, owns_dir,
                                  owns_file, record, seal, settle, sha256_bytes, stage)


def label(what: Optional[str], path: Path) -> str:
    return f"{what} {path}" if what else str(path)


def _oserror(what: Optional[str], path: Path, e: OSError, tail: str = "") -> StorageError:
    reason = e.strerror or str(e)
    if e.errno == errno.ENOTDIR:
        reason = "a part of the path is a file, not a directory"
    return StorageError(f"{label(what, path)}: cannot be written ({reason}); nothing was half-written. "
                        + (tail or "Choose a writable path, or free disk space, then run the command again"))


def shown(names: list, n: int = 5) -> str:
    names = [str(x) for x in names]
    return ", ".join(names[:n]) + (f", ... ({len(names)} in all)" if len(names) > n else "")


# ---- checks before any work ------------------------------------------------------------------------------------


def _check_creatable(path: Path, what: Optional[str], target: Path) -> None:
    """``path`` does not exist: its nearest existing ancestor must be a directory that accepts a new file."""
    ancestor = path
    while not os.path.lexists(ancestor):
        if ancestor.parent == ancestor:
            break
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise StorageError(f"{label(what, target)}: cannot be written, {ancestor} is a file and not a directory; "
                           "choose another path (nothing was written)")
    probe = ancestor / f"{PROBE}-{uuid.uuid4().hex}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise StorageError(f"{label(what, target)}: cannot be written, {ancestor} does not accept new files "
                           f"({e.strerror or e}); choose a writable directory (nothing was written)") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def check_file(path: str | Path, what: Optional[str] = None) -> Path:
    """Refuse, before any work, a file target linlm may not write; return it (``~`` expanded).

    Free: nothing there, in a directory that accepts new files. Linlm's: a file linlm wrote, unchanged. Anything
    else (a user's file, an edited one, a directory, a symbolic link, a path under a file, a read-only place) is a
    one-line OutputError or StorageError, and nothing is changed."""
    path = Path(path).expanduser()
    if path.is_symlink():
        raise OutputError(f"{label(what, path)}: is a symbolic link; linlm does not write through links. Give the "
                          "path it points to, or a new one (nothing was written)")
    if path.is_dir():
        raise OutputError(f"{label(what, path)}: is a directory; give a file name inside it, e.g. "
                          f"{path / 'results.json'} (nothing was written)")
    if path.exists():
        if not owns_file(path):
            raise OutputError(f"{label(what, path)}: exists and linlm did not write it (or it was changed since); "
                              "linlm never replaces such a file. Choose another path, or move the file away "
                              "(nothing was written)")
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise StorageError(f"{label(what, path)}: its directory is not writable; choose a writable path "
                               "(nothing was written)")
        return path
    _check_creatable(path, what, path)
    return path


def check_dir(path: str | Path, what: Optional[str] = None, names: Iterable[str] = ()) -> Path:
    """Refuse, before any work, an output directory linlm may not write into; return it (``~`` expanded).

    Free: nothing there (creatable), or an empty directory. Linlm's: a directory it has written into before (a
    file in its ledger, or only directories linlm made: a user's empty folder that linlm made run directories in);
    then every path of ``names`` (relative, e.g. ``report.md`` or ``plots/a.png``) that exists there must be
    linlm's. A directory holding anything else, a file, or a place that cannot be written is refused in one line."""
    path = Path(path).expanduser()
    if os.path.lexists(path) and not path.is_dir():
        raise StorageError(f"{label(what, path)}: is a file, not a directory; choose a directory (nothing was "
                           "written)")
    if not path.exists():
        _check_creatable(path, what, path)
        return path
    if not has_ledger(path):
        foreign = foreign_entries(path)  # a directory linlm made in it counts as linlm's writing
        if foreign:
            raise OutputError(f"{label(what, path)}: holds files linlm did not write ({shown(foreign)}); choose a "
                              "new or empty directory (nothing was written)")
    for rel in names:
        target = path / rel
        if os.path.lexists(target) and not (target.is_dir() and not target.is_symlink() and owns_dir(target)) \
                and not owns_file(target):
            raise OutputError(f"{label(what, path)}: {target} exists and linlm did not write it (or it was changed "
                              "since), and this command writes that path; move it away or choose another directory "
                              "(nothing was written)")
    if not os.access(path, os.W_OK | os.X_OK):
        raise StorageError(f"{label(what, path)}: is not writable; choose a writable directory (nothing was written)")
    return path


# ---- writing -----------------------------------------------------------------------------------------------------


def make_dir(path: str | Path, what: Optional[str] = None) -> list[Path]:
    """Create ``path`` and its missing parents, each recorded as made by linlm; return those made, deepest
    first. An existing directory is fine (whoever made it); a file in the way is a one-line StorageError. A failure
    part way (a full disk while writing a ledger) removes the directories made so far: nothing is left behind."""
    path = Path(path).expanduser()
    missing = []
    p = path
    while not os.path.lexists(p) and p.parent != p:
        missing.append(p)
        p = p.parent
    if not p.is_dir():
        raise StorageError(f"{label(what, path)}: cannot be written, {p} is a file and not a directory; choose "
                           "another path (nothing was written)")
    made: list[Path] = []
    try:
        for p in reversed(missing):
            # Made under a temporary name with its ledger inside, then renamed: a kill at any moment leaves no
            # directory of linlm's that does not say so.
            tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex}.tmp")
            tmp.mkdir()
            try:
                seal(tmp, p.name)
                os.rename(tmp, p)
                made.insert(0, p)
            except OSError:
                discard_dir(tmp)
                if not p.is_dir():  # not another process making the same directory at the same moment
                    raise
    except OSError as e:
        remove_if_unused(made)
        raise _oserror(what, path, e) from None
    return missing


def discard_dir(tmp: Path) -> None:
    """Remove a temporary directory this process made and did not put in place: its plain files, then itself."""
    with contextlib.suppress(OSError):
        for c in tmp.iterdir():
            if c.is_file() and not c.is_symlink():
                c.unlink()
        tmp.rmdir()


def remove_if_unused(created: Iterable[Path]) -> None:
    """Remove directories this process made (deepest first) that hold nothing but linlm's bookkeeping."""
    for p in created:
        try:
            if any(not bookkeeping(c.name) for c in p.iterdir()):
                return
            for c in p.iterdir():
                c.unlink()
            p.rmdir()
        except OSError:
            return


def _refuse_if_foreign(path: Path, what: Optional[str]) -> None:
    if path.is_symlink() or path.is_dir() or (path.exists() and not owns_file(path)):
        raise OutputError(f"{label(what, path)}: exists and linlm did not write it (or it was changed since); "
                          "linlm never replaces such a file. Move it away, or choose another path (the old file is "
                          "unchanged)")


def _install(tmp: Path, path: Path, sha256: Optional[str] = None, append: bool = False) -> None:
    """Rename the finished (fsynced) temporary file ``tmp`` over ``path``, recorded first as its next version
    (:func:`~linlm.outputs.ledger.stage`), so that a kill at any moment leaves a recorded file at ``path``."""
    entry = file_entry(tmp, sha256, append=append)
    stage(path, entry)
    os.replace(tmp, path)
    fsync_path(path.parent)
    settle(path, entry)


@contextlib.contextmanager
def _temporary(path: Path, what: Optional[str]) -> Iterator[Path]:
    """A temporary name beside ``path`` (its directory made first), removed again on the way out; an OSError
    inside is a one-line StorageError naming ``path``."""
    make_dir(path.parent, what)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        yield tmp
    except OSError as e:
        raise _oserror(what, path, e) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_via(path: str | Path, writer: Callable[[Path], None], what: Optional[str] = None, *,
              sha256: Optional[str] = None) -> Path:
    """Write ``path`` by calling ``writer(tmp)`` on a temporary path beside it (for library writers: safetensors,
    torch.export, onnx), then fsync, rename into place and record it."""
    path = Path(path).expanduser()
    _refuse_if_foreign(path, what)
    with _temporary(path, what) as tmp:
        writer(tmp)
        fsync_path(tmp)
        _install(tmp, path, sha256)
    return path


def _write_tmp(tmp: Path, data: bytes) -> None:
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_bytes(path: str | Path, data: bytes, what: Optional[str] = None) -> Path:
    """Write ``data`` to ``path`` atomically (see the module doc); refuse a file that is not linlm's."""
    return write_via(path, lambda tmp: _write_tmp(tmp, data), what, sha256=sha256_bytes(data))


def write_text(path: str | Path, text: str, what: Optional[str] = None) -> Path:
    return write_bytes(path, text.encode("utf-8"), what)


def json_default(o: Any) -> Any:
    """JSON for what linlm's results hold besides plain types: numpy scalars and arrays, paths, dataclasses."""
    import dataclasses

    if hasattr(o, "item") and callable(o.item) and getattr(o, "ndim", None) == 0:
        return o.item()
    if hasattr(o, "tolist") and callable(o.tolist):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def dumps(obj: Any, indent: Optional[int] = 1) -> str:
    """linlm's JSON text (with :func:`json_default`), ending in a newline."""
    return json.dumps(obj, indent=indent, default=json_default) + "\n"


def write_json(path: str | Path, obj: Any, what: Optional[str] = None, indent: Optional[int] = 1) -> Path:
    return write_bytes(path, dumps(obj, indent).encode("utf-8"), what)


def save_figure(fig, path: str | Path, what: Optional[str] = None, dpi: int = 120) -> Path:
    """Render a matplotlib Figure to PNG and write it (atomically, as every output)."""
    return write_bytes(path, figure_png(fig, dpi), what)


def figure_png(fig, dpi: int = 120) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def copy_file(src: str | Path, dst: str | Path, what: Optional[str] = None) -> Path:
    """Copy ``src`` to ``dst`` as a linlm output."""
    data = Path(src).read_bytes()
    return write_bytes(dst, data, what)


def append_text(path: str | Path, text: str, what: Optional[str] = None) -> Path:
    """Append ``text`` to a log linlm keeps (fsynced); refuse a file that is not linlm's. A log is recorded by the
    sha256 of its first bytes, which appending leaves as they were; a new log is written whole, as any file."""
    path = Path(path).expanduser()
    _refuse_if_foreign(path, what)
    with _temporary(path, what) as tmp:
        if not path.exists():
            _write_tmp(tmp, text.encode("utf-8"))
            _install(tmp, path, append=True)
            return path
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if path.stat().st_size <= HEAD_BYTES:  # the recorded head grows with the log up to HEAD_BYTES
            record(path, append=True)
    return path
