"""How SIGINT and SIGTERM stop a run (``StopOnSignal``): the first cancels it and keeps what is on
the wire, a second aborts; once the output is complete a signal is only noted (``Late``)."""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any

__all__ = ["Late", "StopOnSignal"]


class StopOnSignal:
    """SIGINT and SIGTERM stop a run the same way, in every phase: the first cancels it (nothing new
    starts, answers on the wire are awaited and kept); a second aborts at once. Once the output is
    complete (``finish``), a signal changes nothing: the run ends as it would have, saying so.

    ``with StopOnSignal(say) as stop: asyncio.run(...)``, and ``stop.arm(task)`` inside the loop."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, say: Any) -> None:
        self.received: int | None = None
        self.late: int | None = None  # a signal that came after the output was complete
        self.finished = False
        self._say = say
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._installed = threading.current_thread() is threading.main_thread()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        if self._installed:  # before the loop and after it: a signal is a KeyboardInterrupt, or a note
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._outside_loop)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, Late(self) if self.finished else handler)

    def arm(self, task: asyncio.Task[Any]) -> None:
        self._task, self._loop = task, asyncio.get_running_loop()
        if self._installed:
            for signum in self.SIGNALS:
                signal.signal(signum, self._in_loop)

    def disarm(self) -> None:
        # Each handler is replaced in one step. (The loop's remove_signal_handler would put the default
        # back first, and a SIGTERM in that moment killed a process whose output was complete.)
        if self._installed and self._loop is not None:
            for signum in self.SIGNALS:
                signal.signal(signum, self._outside_loop)

    def finish(self) -> None:
        """The output is complete: from now on a signal is only noted."""
        self.finished = True

    def _outside_loop(self, signum: int, frame: Any) -> None:
        if self.finished:
            self.note_late(signum)
            return
        self.received = signum
        raise KeyboardInterrupt

    def note_late(self, signum: int) -> None:
        if self.late is None:
            self.late = signum
            self._say(f"{signal.Signals(signum).name}: the output is already complete; finishing")

    def _in_loop(self, signum: int, frame: Any) -> None:
        """A signal while the loop runs is handled as the loop's next callback, as ``asyncio.Runner``
        handles its SIGINT: the loop is woken and nothing of its own is touched here."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        if self.finished:
            self.note_late(signum)
            return
        if self.received is not None:
            raise KeyboardInterrupt  # the second signal: leave now
        self.received = signum
        self._say(
            f"{signal.Signals(signum).name}: stopping; waiting for answers on the wire (signal again to abort at once)"
        )
        if self._task is not None:
            self._task.cancel()


class Late:
    """The handler a finished run leaves until its process exits: a signal is noted, nothing more."""

    def __init__(self, stop: StopOnSignal) -> None:
        self._stop = stop

    def __call__(self, signum: int, frame: Any) -> None:
        self._stop.note_late(signum)
