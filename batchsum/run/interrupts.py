"""SIGINT heard on the main thread's behalf while it waits inside native code (a DuckDB query, a
Polars collect), where no Python signal handler runs until that code returns: the runs that asked
(``on_interrupt``) are stopped, each keeping what is on the wire; and one exception for each
signal, however many layers raise one.

The interpreter's C signal handler writes each signal's number to the process's wakeup fd
(``signal.set_wakeup_fd``) from whichever thread the signal lands on, whatever the main thread is
doing. ``listen()`` (on the main thread: a door calls it when it is set up) makes that fd one end of
a socket pair that a thread of ours reads, chained to the fd set before: every byte is passed on to
it, so whoever listened there (an event loop's self-pipe) still hears every signal.

The Python handler still runs on the main thread when it comes back to Python, and raises
``KeyboardInterrupt`` there. Polars raises one of its own from the collect the signal interrupted,
and the handler's came next, into the caller's ``except KeyboardInterrupt:`` block (Polars' issue
23988). So ``listen()`` also puts a handler of ours in front of the Python one (``_OneInterrupt``),
which raises nothing for a signal a wait of the main thread in native code raises itself (a hearing
``main_waits``), and hands every other signal on. ``signal.signal`` would also put Python's own C
handler back in place of the one Polars chained in front of it (which aborts its query): the
process's action for SIGINT is kept as it was (``_keeping_action``).

DuckDB is the other way round: its wait checks signals itself (every 20 ms at most) and raises the
``KeyboardInterrupt`` it gets as an error of its own ("Query interrupted"), never as a
``KeyboardInterrupt``; a query a stopper ended first raises DuckDB's ``InterruptException`` before the
handler has run, and the handler's ``KeyboardInterrupt`` came second, into the caller's ``except``
block. A hearing ``main_first`` is called only once the main thread has heard the signal (the
handler in front of Python's has run for it), or after ``MAIN_HEARS`` seconds if it never does: the
main thread's wait raises its one exception first, whatever it is.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import select
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..service.errors import RunInterrupted

__all__ = ["Hearing", "listen", "on_interrupt"]

Stopper = Callable[[RunInterrupted], None]
MAIN_HEARS = 1.0  # at most this long a ``main_first`` stopper waits for the main thread to hear the signal
_SIGACTION_BYTES = 1024  # room for a ``struct sigaction`` on any platform (152 bytes on Linux x86-64), held opaque


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
    waits for the answers on the wire it awaits), and every byte goes on to the fd set before ours.
    It counts the SIGINTs heard, and which of them a wait of the main thread raises itself
    (``owed``), for the handler in front of Python's (``_OneInterrupt``), which counts the ones it
    has run for (``handled``: a ``main_first`` stopper waits for its signal's turn there)."""

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)  # what set_wakeup_fd asks: the C handler never blocks
        self._read.setblocking(False)  # read under the lock, once select says there is something
        self._previous: tuple[int, tuple[int, int]] | None = None
        self._stoppers: dict[int, tuple[Stopper, Hearing]] = {}
        self._numbers = itertools.count()
        self._lock = threading.RLock()  # the handler in front of Python's may run on a thread holding it
        self._accounted = threading.Condition(self._lock)  # the handler in front of Python's has run
        self._heard = 0  # SIGINTs heard so far
        self._handled = 0  # of those, the ones the handler in front of Python's has accounted for
        self._owed: set[int] = set()  # the SIGINTs (by number) a wait of the main thread raises itself
        threading.Thread(target=self._hear, name="batchsum-signals", daemon=True).start()

    def install(self) -> bool:
        """Our fd as the wakeup fd (again, if someone set another since: that one is chained), and
        our handler in front of Python's. Only the main thread may set them; elsewhere, False and
        nothing changes."""
        if threading.current_thread() is not threading.main_thread():
            return False
        ours = self._write.fileno()
        try:
            previous = signal.set_wakeup_fd(ours, warn_on_full_buffer=False)
        except ValueError:  # not the main interpreter
            return False
        if previous != ours:
            self._previous = _identity(previous)
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler) and not isinstance(handler, _OneInterrupt):
            _keeping_action(lambda: signal.signal(signal.SIGINT, _OneInterrupt(handler, self)))
        return True

    def add(self, stopper: Stopper, hearing: Hearing) -> int:
        with self._lock:
            number = next(self._numbers)
            self._stoppers[number] = (stopper, hearing)
        return number

    def remove(self, number: int) -> None:
        with self._lock:
            self._stoppers.pop(number, None)

    def _hear(self) -> None:
        while True:
            try:
                select.select([self._read], [], [])
            except (OSError, ValueError):  # pragma: no cover - the socket is never closed while the process lives
                return
            self.hear_pending()

    def hear_pending(self) -> None:
        """What the C handler wrote, heard now, on this thread: read and counted under the lock, so
        that no byte is ever read and not yet counted when the handler in front of Python's looks."""
        with self._lock:
            while True:
                try:
                    data = self._read.recv(512)
                except OSError:  # nothing more (BlockingIOError)
                    return
                self._pass_on(data)
                if signals := data.count(int(signal.SIGINT)):
                    self._interrupted(signals)

    def _pass_on(self, data: bytes) -> None:
        previous = self._previous
        if previous is None or _identity(previous[0]) != previous:
            return  # none, or closed since (its number may be another file's now)
        with contextlib.suppress(OSError):  # full or gone: as the C handler, never wait
            os.write(previous[0], data)

    def _interrupted(self, signals: int) -> None:
        with self._lock:
            stoppers = list(self._stoppers.values())
            heard, self._heard = self._heard, self._heard + signals
            if any(hearing.main_waits for _, hearing in stoppers):
                self._owed.update(range(heard + 1, self._heard + 1))
        for stopper, hearing in stoppers:
            call = self._after_main if hearing.main_first else self._now
            threading.Thread(target=call, args=(stopper, heard + signals), name="batchsum-interrupt").start()

    @staticmethod
    def _now(stopper: Stopper, signal_number: int) -> None:
        stopper(RunInterrupted())

    def _after_main(self, stopper: Stopper, signal_number: int) -> None:
        """``stopper`` called once the handler in front of Python's has run for the signal (the
        main thread heard it first), or after ``MAIN_HEARS`` seconds."""
        with self._accounted:
            self._accounted.wait_for(lambda: self._handled >= signal_number, MAIN_HEARS)
        stopper(RunInterrupted())

    def raised_already(self) -> bool:
        """Whether every SIGINT since the handler last ran is one a wait of the main thread raises
        itself (its ``KeyboardInterrupt`` is that signal's one), with what is pending heard first."""
        with self._lock:
            self.hear_pending()
            covered = set(range(self._handled + 1, self._heard + 1))
            self._handled = self._heard
            owed = bool(covered) and covered <= self._owed
            self._owed -= covered
            self._accounted.notify_all()
        return owed


class _OneInterrupt:
    """The SIGINT handler in front of Python's (``previous``): nothing for a signal a wait of the
    main thread in native code raised already (a Polars collect), ``previous`` for every other."""

    def __init__(self, previous: Callable[[int, FrameType | None], Any], listener: _Listener) -> None:
        self.previous = previous
        self._listener = listener

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        if self._listener.raised_already():
            return None
        return self.previous(signum, frame)


def _keeping_action(install: Callable[[], object]) -> None:
    """``install`` (``signal.signal`` for SIGINT), with the process's action for SIGINT left as it
    was: Python sets its own C handler, which would take the place of one chained in front of it
    (Polars' aborts its query, then calls Python's). Where the action cannot be read (no
    ``sigaction``), nothing is installed."""
    try:
        sigaction = ctypes.CDLL(None, use_errno=True).sigaction
    except (OSError, AttributeError, TypeError):
        return
    action = ctypes.create_string_buffer(_SIGACTION_BYTES)
    if sigaction(int(signal.SIGINT), None, action) != 0:
        return
    install()
    sigaction(int(signal.SIGINT), action, None)


_listener: _Listener | None = None
_made = threading.Lock()


def _the_listener() -> _Listener:
    global _listener
    with _made:
        if _listener is None:
            _listener = _Listener()
        return _listener


def listen() -> bool:
    """Hear SIGINT while the main thread is inside native code, from now on, and raise one
    ``KeyboardInterrupt`` for it: True when listening (called on the main thread; elsewhere it
    changes nothing, and what was set up before stays)."""
    return _the_listener().install()


class Hearing:
    """A stopper heard from: until ``remove()`` (or the end of its ``with`` block), a SIGINT heard
    calls ``stopper(RunInterrupted())`` on a thread of its own (the runs it stops are on other
    threads: it may wait for their answers on the wire). ``main_waits``: the main thread waits on
    what it stops, inside native code that raises the signal's ``KeyboardInterrupt`` itself (a
    Polars collect): Python's handler raises no second one. ``main_first``: the stopper is called
    once the main thread has heard the signal (at most ``MAIN_HEARS`` later), so that a wait of the
    main thread that turns it into an error of its own (a DuckDB query) raises that one first."""

    def __init__(self, stopper: Stopper, main_waits: bool = False, main_first: bool = False) -> None:
        self.main_waits = main_waits
        self.main_first = main_first
        self._listener = _the_listener()
        self._number = self._listener.add(stopper, self)

    def remove(self) -> None:
        self._listener.remove(self._number)

    def __enter__(self) -> Hearing:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


def on_interrupt(stopper: Stopper, *, main_waits: bool = False, main_first: bool = False) -> Hearing:
    """``stopper`` is called when SIGINT is heard, until the ``Hearing`` is removed: ``with
    on_interrupt(stream.cancel): ...`` for a block, ``on_interrupt(stop_all)`` for good
    (``main_waits``, ``main_first``: see ``Hearing``)."""
    return Hearing(stopper, main_waits, main_first)
