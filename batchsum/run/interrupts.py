"""SIGINT heard on the main thread's behalf while it waits inside native code (a DuckDB query, a
Polars collect), where no Python signal handler runs until that code returns: the runs that asked
(``on_interrupt``) are stopped at once, each keeping what is on the wire.

The interpreter's C signal handler writes each signal's number to the process's wakeup fd
(``signal.set_wakeup_fd``) from whichever thread the signal lands on, whatever the main thread is
doing. ``listen()`` (on the main thread: a door calls it when it is set up) makes that fd one end of
a socket pair that a thread of ours reads, chained to the fd set before: every byte is passed on to
it, so whoever listened there (an event loop's self-pipe) still hears every signal. The Python
handler (``KeyboardInterrupt``) still runs on the main thread when it comes back to Python.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import threading
from collections.abc import Callable

from ..service.errors import RunInterrupted

__all__ = ["Hearing", "listen", "on_interrupt"]

Stopper = Callable[[RunInterrupted], None]


def _identity(fd: int) -> tuple[int, tuple[int, int]] | None:
    """An fd and what it is (device, inode), or None for no fd: a byte is passed on only to the
    same file, never to another one that reused its number after it was closed."""
    if fd < 0:
        return None
    try:
        status = os.fstat(fd)
    except OSError:
        return None
    return fd, (status.st_dev, status.st_ino)


class _Listener:
    """The socket pair whose write end is the wakeup fd, and the thread that reads the other end:
    SIGINT calls every stopper, each on a thread of its own (not a daemon: the interpreter's exit
    waits for the answers on the wire it awaits), and every byte goes on to the fd set before ours."""

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)  # what set_wakeup_fd asks: the C handler never blocks
        self._previous: tuple[int, tuple[int, int]] | None = None
        self._stoppers: dict[int, Stopper] = {}
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        threading.Thread(target=self._hear, name="batchsum-signals", daemon=True).start()

    def install(self) -> bool:
        """Our fd as the wakeup fd (again, if someone set another since: that one is chained). Only
        the main thread may set it; elsewhere, False and nothing changes."""
        if threading.current_thread() is not threading.main_thread():
            return False
        ours = self._write.fileno()
        try:
            previous = signal.set_wakeup_fd(ours, warn_on_full_buffer=False)
        except ValueError:  # not the main interpreter
            return False
        if previous != ours:
            self._previous = _identity(previous)
        return True

    def add(self, stopper: Stopper) -> int:
        with self._lock:
            number = next(self._numbers)
            self._stoppers[number] = stopper
        return number

    def remove(self, number: int) -> None:
        with self._lock:
            self._stoppers.pop(number, None)

    def _hear(self) -> None:
        while True:
            try:
                data = self._read.recv(512)
            except OSError:  # pragma: no cover - the socket is never closed while the process lives
                return
            self._pass_on(data)
            if int(signal.SIGINT) in data:
                self._interrupted()

    def _pass_on(self, data: bytes) -> None:
        previous = self._previous
        if previous is None or _identity(previous[0]) != previous:
            return  # none, or closed since (its number may be another file's now)
        with contextlib.suppress(OSError):  # full or gone: as the C handler, never wait
            os.write(previous[0], data)

    def _interrupted(self) -> None:
        with self._lock:
            stoppers = list(self._stoppers.values())
        for stopper in stoppers:
            threading.Thread(target=stopper, args=(RunInterrupted(),), name="batchsum-interrupt").start()


_listener: _Listener | None = None
_made = threading.Lock()


def _the_listener() -> _Listener:
    global _listener
    with _made:
        if _listener is None:
            _listener = _Listener()
        return _listener


def listen() -> bool:
    """Hear SIGINT while the main thread is inside native code, from now on: True when listening
    (called on the main thread; elsewhere it changes nothing, and what was set up before stays)."""
    return _the_listener().install()


class Hearing:
    """A stopper heard from: until ``remove()`` (or the end of its ``with`` block), a SIGINT heard
    calls ``stopper(RunInterrupted())`` on a thread of its own (the runs it stops are on other
    threads: it may wait for their answers on the wire)."""

    def __init__(self, stopper: Stopper) -> None:
        self._listener = _the_listener()
        self._number = self._listener.add(stopper)

    def remove(self) -> None:
        self._listener.remove(self._number)

    def __enter__(self) -> Hearing:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


def on_interrupt(stopper: Stopper) -> Hearing:
    """``stopper`` is called when SIGINT is heard, until the ``Hearing`` is removed: ``with
    on_interrupt(stream.cancel): ...`` for a block, ``on_interrupt(stop_all)`` for good."""
    return Hearing(stopper)
