"""The lock file beside a run's file (``.NAME.lock``), which holds the file's resolved path while
it does not exist or is replaced; and who holds an ``flock`` on a file (``flock_holder``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Callable
from pathlib import Path

from ..service.errors import InputError

__all__ = ["LockFile", "flock_holder"]


def flock_holder(device: int, inode: int) -> str | None:
    """Who holds an ``flock`` on the file (device, inode), from ``/proc/locks`` (Linux); None elsewhere."""
    wanted = f"{os.major(device):02x}:{os.minor(device):02x}:{inode}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            for line in locks:
                fields = line.split()
                # "1: FLOCK ADVISORY WRITE 1234 08:01:5678 0 EOF"; waiters have "->" after the number.
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted:
                    return f"pid {fields[4]} on {socket.gethostname()}"
    except OSError:
        pass
    return None


class LockFile:
    """``.NAME.lock`` beside the real file ``real``: an ``flock`` on it, naming its holder ("pid N on
    HOST"). Released by closing it (or by the process ending, however it ends); the file is removed
    first, so that a waiter sees it is gone."""

    __slots__ = ("path", "fd")

    def __init__(self, real: Path) -> None:
        self.path = real.with_name(f".{real.name}.lock")
        self.fd: int | None = None

    def take(
        self, name: Path, *, wait: bool, refusal: Callable[[str], InputError], waiting: Callable[[str], None]
    ) -> None:
        """Lock it (``name``: the run's file as given, for messages). Held by another process: raise
        ``refusal(holder)``, or with ``wait``, say ``waiting(holder)`` and wait for it."""
        while True:
            fd = self._open(name)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
                if not wait:
                    os.close(fd)
                    raise refusal(holder) from None
                waiting(holder)
                fcntl.flock(fd, fcntl.LOCK_EX)
            # The holder removes the lock file when it is done: a lock on a removed file holds nothing.
            try:
                same = os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        self.fd = fd

    def _open(self, name: Path) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        try:
            return os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise InputError(f"cannot lock {name}: {exc.strerror} ({self.path})") from None

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):  # a folder made read-only: the lock file stays, unlocked
                self.path.unlink(missing_ok=True)  # before unlocking: a waiter then sees it is gone
            os.close(self.fd)  # closing releases the flock
            self.fd = None
