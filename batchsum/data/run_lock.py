"""``RunLock``: the lock a run takes on its journal and its output, which follows the file's
identity (its resolved path, and its inode while it exists), so every spelling of it meets one lock."""

from __future__ import annotations

import fcntl
import os
import stat
import sys
import threading
from pathlib import Path
from typing import Any

from ..service.errors import InputError
from .lock_file import LockFile, flock_holder

__all__ = ["RunLock"]


# Every RunLock this process holds, by what it locks: ("path", resolved path) and, while it holds the
# file itself, ("inode", device, inode). A second RunLock here on the same file (the output and the
# journal given as one file under two names) is refused by name instead of waiting on itself.
_held: dict[tuple[Any, ...], RunLock] = {}
_held_guard = threading.Lock()


class RunLock:
    """This process's exclusive hold on the file at ``path`` for a run. The lock follows the file's
    identity, so that every spelling of it (a symlink, ``dir/../name``, a hard link) meets the same lock:

    - its resolved path (``os.path.realpath``), through ``.NAME.lock`` beside the real file: this
      holds while the file does not exist yet, and while it is replaced (an output is renamed into
      place when complete);
    - while the file exists, its inode, through the file itself, which every hard link shares: taken
      at the start when the file is there, and when a ``Journal`` creates it under this lock.

    Both are ``flock`` locks: released when the process ends, however it ends, so a crash leaves no
    stale lock; the lock file is removed when the run is done. ``wait``: wait for the other run
    instead of refusing at once."""

    def __init__(self, path: str | os.PathLike[str], what: str, *, wait: bool = False) -> None:
        self.path = Path(path)
        self.what = what
        self.real = Path(os.path.realpath(self.path))
        self._wait = wait
        self._beside = LockFile(self.real)  # the lock on the resolved path
        self._file_fd: int | None = None
        self._inode: tuple[Any, ...] | None = None  # the inode lock's key in _held, while held
        self._keys: list[tuple[Any, ...]] = []
        try:
            self._claim(("path", str(self.real)))
            self._beside.take(self.path, wait=wait, refusal=self._refusal, waiting=self._waiting)
            self._lock_file()
        except BaseException:
            self.release()
            raise

    def _refusal(self, holder: str) -> InputError:
        return InputError(
            f"the {self.what} {self.path} is in use by another batchsum run ({holder}); "
            "wait for it to finish, or pass --wait"
        )

    def _waiting(self, holder: str) -> None:
        print(f"batchsum: waiting for the other run on {self.path} ({holder}) to finish", file=sys.stderr)

    def _claim(self, key: tuple[Any, ...]) -> None:
        with _held_guard:
            other = _held.get(key)
            if other is not None and other is not self:
                if other.what != self.what:
                    raise InputError(
                        f"the {self.what} {self.path} is the {other.what} {other.path} under another name; "
                        f"give the {self.what} a path of its own"
                    )
                raise self._refusal(f"pid {os.getpid()}, this process")
            _held[key] = self
            self._keys.append(key)

    def _unclaim(self, key: tuple[Any, ...]) -> None:
        with _held_guard:
            if _held.get(key) is self:
                del _held[key]
        self._keys.remove(key)

    def _lock_file(self) -> None:
        """The lock on the inode, while the file exists: an ``flock`` on the file itself, opened
        read-only (it is never written through this descriptor; SQLite's own locks are ``fcntl``
        locks, which ``flock`` does not meet). A file that cannot be opened (no read permission) or
        is not a regular file has the path lock only."""
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        while True:
            try:
                fd = os.open(self.real, flags)
            except OSError:
                return  # not there yet (its resolved path is its identity until it is created), or not ours to open
            if not self._hold_file(fd):
                return
            # Still the file at that path? An output renamed into place while this run waited is
            # another inode: lock that one instead.
            try:
                now = os.stat(self.real, follow_symlinks=False)
            except FileNotFoundError:
                return
            if self._inode == ("inode", now.st_dev, now.st_ino):
                return
            self._drop_file()

    def _hold_file(self, fd: int) -> bool:
        """Take the inode lock through ``fd`` (this lock keeps ``fd``); False, with ``fd`` closed,
        for a file that is not a regular file."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return False
        key = ("inode", st.st_dev, st.st_ino)
        try:
            self._claim(key)
        except InputError:
            os.close(fd)
            raise
        self._file_fd, self._inode = fd, key
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = flock_holder(st.st_dev, st.st_ino) or "another process"
            if not self._wait:
                raise self._refusal(holder) from None  # the caller releases
            self._waiting(holder)
            fcntl.flock(fd, fcntl.LOCK_EX)
        return True

    def _drop_file(self) -> None:
        if self._file_fd is not None:
            os.close(self._file_fd)  # closing releases the flock
            self._file_fd = None
        if self._inode is not None:
            self._unclaim(self._inode)
            self._inode = None

    @staticmethod
    def created(path: str | os.PathLike[str], fd: int) -> None:
        """The file at ``path`` was just created, through ``fd``, by this process: the ``RunLock``
        this process holds on ``path`` (if any) now locks its inode too. Raises ``InputError`` when
        another run reached the new file first (through a hard link made at once)."""
        with _held_guard:
            lock = _held.get(("path", os.path.realpath(path)))
        if lock is None or lock._file_fd is not None or lock._beside.fd is None:
            return
        try:
            lock._hold_file(os.dup(fd))
        except InputError:
            lock._drop_file()
            raise

    def release(self) -> None:
        self._beside.release()
        self._drop_file()
        for key in list(self._keys):
            self._unclaim(key)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.release()
