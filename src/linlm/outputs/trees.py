"""Removing what linlm wrote, and replacing whole directories (see linlm.outputs)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from linlm.errors import ConfigError, OutputError, StorageError
from linlm.io_utils import fsync_path
from linlm.locking import LOCK_FILE, DirLock, check_unlocked
from linlm.outputs.files import discard_dir, label, make_dir, shown
from linlm.outputs.ledger import LEDGER, bookkeeping, owns_dir, owns_file, read_ledger, seal, update_ledger

log = logging.getLogger("linlm")


# ---- removing ----------------------------------------------------------------------------------------------------


@dataclass
class Removal:
    """What :func:`remove_tree` would do to a tree: the files and directories it removes, what it keeps."""

    root: Path
    files: list[Path] = field(default_factory=list)
    dirs: list[Path] = field(default_factory=list)  # made by linlm and nothing of the user's inside: removed
    kept: list[Path] = field(default_factory=list)  # the user's: never touched
    edited: list[Path] = field(default_factory=list)  # of kept: files the ledger lists, changed since written
    locked: list[Path] = field(default_factory=list)  # directories holding a lock file
    visited: list[Path] = field(default_factory=list)  # every directory walked, deepest first


def plan_removal(root: str | Path) -> Removal:
    """Walk ``root`` and sort what is in it into linlm's (to remove) and the user's (to keep). Changes nothing."""
    root = Path(root)
    plan = Removal(root)
    if not root.is_dir() or root.is_symlink():
        return plan

    def walk(d: Path) -> bool:
        """True when everything under d is linlm's."""
        ledger = read_ledger(d)
        clean = True
        for child in sorted(d.iterdir()):
            if child.name == LEDGER:
                continue
            if child.name == LOCK_FILE:
                plan.locked.append(d)
                continue
            if bookkeeping(child.name) and child.is_file() and not child.is_symlink():
                plan.files.append(child)  # a temporary file of linlm's left by a crash
                continue
            if child.is_dir() and not child.is_symlink() and owns_dir(child):
                clean = walk(child) and clean
            elif owns_file(child, ledger):
                plan.files.append(child)
            else:
                plan.kept.append(child)
                if child.name in ledger.entries:
                    plan.edited.append(child)
                clean = False
        plan.visited.append(d)
        if clean and ledger.created:
            plan.dirs.append(d)
        return clean

    walk(root)
    return plan


def check_removal(root: str | Path, what: Optional[str] = None, *, held: Iterable[str | Path] = (),
                  blocks: Optional[Callable[[str], bool]] = None, refuse_edited: bool = False) -> Removal:
    """Every check :func:`remove_tree` makes, made without changing anything; returns its plan.

    A command that will replace a tree calls this among its checks before any work (before it takes a lock of its
    own), so that a refusal leaves the tree byte for byte as it was, lock files included:
    - a kept path in the way (``blocks``, ``refuse_edited``: see :func:`remove_tree`) refuses (OutputError);
    - a directory of the tree that another live process holds refuses (LockedError); ``held``: the directories
      whose lock this process holds."""
    root = Path(root).expanduser()
    plan = plan_removal(root)
    in_way = [p for p in plan.kept if (blocks is not None and blocks(p.relative_to(root).as_posix()))
              or (refuse_edited and p in plan.edited)]
    if in_way:
        raise OutputError(f"{label(what, root)}: {shown([str(p) for p in in_way], 3)} is not linlm's (or was "
                          "changed since linlm wrote it) and is where this command writes; move it out of "
                          f"{root}, then run the command again (nothing was removed)")
    held_paths = {Path(p).resolve() for p in held}
    for d in plan.locked:
        if d.resolve() not in held_paths:
            check_unlocked(d, what or "directory")
    return plan


def remove_tree(root: str | Path, what: Optional[str] = None, *, held: Iterable[str | Path] = (),
                blocks: Optional[Callable[[str], bool]] = None, refuse_edited: bool = False,
                keep_root: bool = True, spare: Optional[Callable[[str], bool]] = None) -> list[Path]:
    """Remove what linlm wrote under ``root``; return the paths kept (the user's).

    Before anything is removed:
    - ``blocks(rel)`` says whether a kept path (relative to root, with ``/``) is in the way of what the caller
      writes next, and ``refuse_edited`` counts every file linlm wrote and the user changed since as in the way;
      any such path refuses the removal (OutputError);
    - every directory of the tree that holds a lock file is locked here (``held``: those this process holds
      already), so a directory another live process holds is never cleared (LockedError).
    Either way nothing has been removed (and no lock file written: :func:`check_removal` runs first). ``keep_root``:
    leave ``root`` itself (else it goes too when linlm made it and nothing of the user's is in it). ``spare(rel)``:
    files of linlm's to leave in place, with the directories above them (a marker the caller rewrites next, so
    that a removal cut short still says what the directory is)."""
    root = Path(root).expanduser()
    held = [Path(p).resolve() for p in held]
    plan = check_removal(root, what, held=held, blocks=blocks, refuse_edited=refuse_edited)
    if spare is not None:
        spared = [f for f in plan.files if spare(f.relative_to(root).as_posix())]
        plan.files = [f for f in plan.files if f not in spared]
        above = {d for f in spared for d in f.parents}
        plan.dirs = [d for d in plan.dirs if d not in above]
    locks: list[DirLock] = []
    try:
        for d in plan.locked:
            if d.resolve() not in held:
                locks.append(DirLock(d, what or "directory").acquire())
        removed: dict[Path, list[str]] = {}
        for f in plan.files:
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
            removed.setdefault(f.parent, []).append(f.name)
        for d in plan.visited:  # deepest first: a directory's children are dealt with before it
            if d in plan.dirs and not (keep_root and d == root):
                for c in d.iterdir():  # only bookkeeping is left in it
                    c.unlink()
                d.rmdir()
            elif removed.get(d):
                update_ledger(d, dict.fromkeys(removed[d]))
    except OSError as e:
        raise StorageError(f"{label(what, root)}: could not remove linlm's files ({e.strerror or e}); fix the "
                           "permissions, then run the command again") from None
    finally:
        for lock in locks:
            lock.release()
    if plan.kept:
        log.info("%s: kept what linlm did not write: %s", root, shown([str(p.relative_to(root)) for p in plan.kept]))
    return plan.kept


def remove_file(path: str | Path, what: Optional[str] = None) -> bool:
    """Remove one file when it is linlm's (its ledger lists it, unchanged since written) or one of linlm's
    temporary files, and drop it from the ledger; return whether it was removed. A user's file (or a changed
    one, a directory, a link, nothing) is left as it is. For a command that removes some of its own files and
    keeps the rest (a resumed job dropping what it wrote after its last commit)."""
    path = Path(path)
    if path.is_symlink() or not path.is_file() or path.name in (LEDGER, LOCK_FILE):
        return False
    temporary = bookkeeping(path.name)
    if not temporary and not owns_file(path):
        return False
    try:
        path.unlink()
        if not temporary:
            update_ledger(path.parent, {path.name: None})
    except FileNotFoundError:
        return False
    except OSError as e:
        raise StorageError(f"{label(what, path)}: could not remove linlm's file ({e.strerror or e}); fix the "
                           "permissions, then run the command again") from None
    return True


# ---- whole directories -------------------------------------------------------------------------------------------


def temp_dir_beside(path: str | Path) -> Path:
    """A new empty directory beside ``path`` (its parent created as linlm's if missing), to fill and then
    :func:`commit_dir` into place."""
    path = Path(path)
    make_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.mkdir()
    return tmp


def discard(tmp: str | Path) -> None:
    """Remove a temporary directory this process made with :func:`temp_dir_beside` and did not commit: its plain
    files, then the directory (anything else in it stays, with the directory)."""
    tmp = Path(tmp)
    if tmp.is_dir() and not tmp.is_symlink():
        discard_dir(tmp)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE). False where the system cannot."""
    import ctypes
    import sys

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


def commit_dir(tmp: Path, path: str | Path, digests: Optional[dict[str, str]] = None) -> None:
    """Put the finished directory ``tmp`` at ``path``: every file is recorded (:func:`seal`) and fsynced, then

    - ``path`` absent, or an empty directory: ``tmp`` is renamed into place;
    - ``path`` a directory: the two are swapped in one step where the system allows it (Linux), else by two
      renames; then what linlm wrote in the old directory is removed (:func:`remove_tree`). Anything of the
      user's in it stays in ``.NAME.<id>.old`` beside ``path``, named in a warning;
    - ``path`` a file: OSError (NotADirectoryError), and nothing changes.

    An error is raised only before anything has moved; once ``tmp`` is in place, a failure to clean the old
    directory is a warning."""
    path = Path(path)
    seal(tmp, path.name, digests)
    for child in tmp.iterdir():
        fsync_path(child)
    fsync_path(tmp)
    if path.is_dir() and not path.is_symlink() and any(not (bookkeeping(c.name) and c.is_file())
                                                       for c in path.iterdir()):
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
            left = [str(p.relative_to(old)) for p in remove_tree(old, keep_root=False)]
        except (OSError, ConfigError) as e:
            left = [f"({e})"]
        if left:
            log.warning("%s was replaced; the old directory held files linlm did not write (%s), kept in %s",
                        path, shown(left), old)
        return
    if path.is_dir() and not path.is_symlink():
        for c in path.iterdir():  # only bookkeeping files: the rename needs an empty directory
            c.unlink()
    os.replace(tmp, path)  # onto a new name or an empty directory; refuses a file
    fsync_path(path.parent)
