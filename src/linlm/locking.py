"""Advisory directory locks that die with their process.

``DirLock(directory, what)`` takes an exclusive ``fcntl.flock`` on ``directory/.lock`` and writes the holder's
PID and host into it. The kernel drops a flock when the file descriptor closes, which includes a process killed
with SIGKILL, so a lock left by a dead process never blocks the next one: the stale file is simply locked again.
The file itself stays (deleting a lock file races with a process that has just opened it).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from pathlib import Path
from typing import Optional

from linlm.errors import LinlmError, LockedError, StorageError

log = logging.getLogger("linlm")

LOCK_FILE = ".lock"


def holder_of(lock_path: Path) -> str:
    """'PID 1234 on host' from a lock file, or 'another process' when it cannot be read yet."""
    try:
        text = lock_path.read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError):
        text = []
    if not text:
        return "another process"
    host = text[1] if len(text) > 1 else ""
    return f"PID {text[0]}" + (f" on {host}" if host and host != socket.gethostname() else "")


def in_use(what: str, directory: Path, lock_path: Path) -> LockedError:
    return LockedError(f"{what} {directory} is in use by {holder_of(lock_path)}; wait for it to finish (or stop it), "
                       "or choose another directory")


def check_unlocked(directory: str | Path, what: str) -> None:
    """Raise LockedError when another live process holds the lock of ``directory``; else do nothing.

    The lock file is neither created nor written, so a command can run this among its checks before any work
    and a refusal leaves the directory byte for byte as it was (taking the lock writes the holder's PID into the
    file). A lock this process holds through another descriptor counts as held: skip the directories you hold."""
    import fcntl

    directory = Path(directory)
    path = directory / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file, or one nobody can open: nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise in_use(what, directory, path) from None
    finally:
        os.close(fd)  # closing drops the probe's lock at once


class DirLock:
    """An exclusive lock on ``directory`` (which must exist) for the life of this object or ``with`` block."""

    def __init__(self, directory: str | Path, what: str):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.what = what
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait: bool = False, poll_s: float = 0.2) -> "DirLock":
        """Take the lock. Held elsewhere: raise LockedError naming the holder, or with ``wait`` block until free."""
        import fcntl

        if self._fd is not None:
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StorageError(f"{self.what} {self.directory}: cannot create the lock file {self.path} "
                             f"({e.strerror}); choose a writable directory") from None
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise LinlmError(f"{self.what} {self.directory}: cannot lock {self.path} ({e.strerror})") from None
                if not wait:
                    os.close(fd)
                    raise in_use(self.what, self.directory, self.path) from None
                if not said:
                    log.info("%s %s is in use by %s; waiting for it", self.what, self.directory, holder_of(self.path))
                    said = True
                time.sleep(poll_s)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        except OSError:
            pass  # the lock holds without the note; a rival then reports "another process"
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing drops the flock

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class FileLock:
    """An exclusive lock on the output file ``path`` for the life of a command (from its checks to its write), so
    that a second command writing the same file is refused (LockedError naming the file and the holder) instead of
    one of the two results being silently lost. The lock is a :class:`DirLock` on a directory named after the
    file's absolute path under ``lock_root`` (linlm's cache), so nothing is written beside the user's file."""

    def __init__(self, path: str | Path, what: str, lock_root: str | Path):
        import hashlib

        self.file = Path(path).expanduser().absolute()
        self.what = what
        key = hashlib.sha256(str(self.file).encode()).hexdigest()[:24]
        self._lock = DirLock(Path(lock_root) / "locks" / key, what)

    def __enter__(self) -> "FileLock":
        try:
            self._lock.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"{self.what} {self.file}: cannot make its lock in {self._lock.directory} "
                               f"({e.strerror})") from None
        try:
            self._lock.acquire()
        except LockedError:
            raise LockedError(f"{self.what} {self.file} is being written by {holder_of(self._lock.path)}; wait for it "
                              "to finish, or give another file (nothing was changed)") from None
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()
