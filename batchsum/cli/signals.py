"""How SIGINT and SIGTERM stop the command. Before a run and after it (``CommandSignals``): a
signal stops the command with its exit code, 130 or 143. During a run (``StopOnSignal``): the first
cancels it and keeps what is on the wire, a second aborts at once; once the output is complete a
signal is only noted (``Late``). In the command's own process, from the moment a run stopped until
the process is gone, a further signal ends it at once (``Abort``) with its own exit code, never by
the signal's default disposition (which Python's own exit would otherwise put back: a raw -2)."""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import sys
import threading
from typing import Any

from .console import EXIT_INTERRUPTED, EXIT_TERMINATED

__all__ = ["Abort", "CommandSignals", "Late", "StopOnSignal", "exit_code"]


def exit_code(signum: int | None) -> int:
    """The command's exit code after ``signum``: 143 for SIGTERM, else 130 (SIGINT, Ctrl-C)."""
    return EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED


def _name(signum: int) -> str:
    return signal.Signals(signum).name


class CommandSignals:
    """The command's signals outside a run: SIGINT (and SIGTERM, when nobody else handles it) raise
    ``KeyboardInterrupt``, noting which came (``code``). ``leave()`` when the command is done: called
    from Python (``main([...])``), every handler is put back; in its own process, a finished run's
    handlers stay (a signal is noted), any other outcome's become ``Abort`` (a signal leaves at once
    with its exit code), and at the interpreter's exit both become SIG_IGN, so that the default is
    never put back while the process exits (Python's own exit would, and a signal then is a raw -2)."""

    def __init__(self, say: Any, *, own_process: bool) -> None:
        self.last: int | None = None  # the latest signal
        self.own_process = own_process
        self._say = say
        self._installed = threading.current_thread() is threading.main_thread()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> CommandSignals:
        if self._installed:
            for signum in StopOnSignal.SIGNALS:
                previous = self._previous[signum] = signal.getsignal(signum)
                if signum == signal.SIGINT or previous == signal.SIG_DFL:  # SIGTERM stops like Ctrl-C
                    signal.signal(signum, self._interrupt)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if not self._installed:
            return
        if not self.own_process:
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
            return
        for signum in StopOnSignal.SIGNALS:
            if not isinstance(signal.getsignal(signum), Late):
                signal.signal(signum, Abort(self))
        atexit.register(_ignore_signals)

    @property
    def code(self) -> int:
        return exit_code(self.last)

    def _interrupt(self, signum: int, frame: Any) -> None:
        self.last = signum
        raise KeyboardInterrupt

    def abort(self, signum: int) -> None:
        """A signal once the command is done: its process ends at once with the signal's exit code."""
        self.last = signum
        _leave(self._say, f"{_name(signum)}: leaving at once (exit {self.code}); what was done is kept", self.code)
        raise KeyboardInterrupt  # pragma: no cover - _leave ends the process


def _leave(say: Any, line: str, code: int) -> None:
    say(line)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _ignore_signals() -> None:
    """The interpreter's last step before it puts each Python handler back to the default."""
    for signum in StopOnSignal.SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


class StopOnSignal:
    """SIGINT and SIGTERM stop a run the same way, in every phase: the first cancels it (nothing new
    starts, answers on the wire are awaited and kept); a second aborts at once, with its own exit
    code (``code``: the last signal's). Once the output is complete (``finish``), a signal changes
    nothing: the run ends as it would have, saying so. ``command``: the command's ``CommandSignals``,
    told of every signal; in a process of the command's own, a second signal after the run's loop
    ended leaves at once (``Abort``).

    ``with StopOnSignal(say) as stop: asyncio.run(...)``, and ``stop.arm(task)`` inside the loop."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, say: Any, *, command: CommandSignals | None = None) -> None:
        self.received: int | None = None  # the first signal: it stopped the run
        self.late: int | None = None  # a signal that came after the output was complete
        self.finished = False
        self.own_process = command is not None and command.own_process
        self._command = command
        self._last: int | None = None
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
            if self.finished:
                handler = Late(self)
            elif self.received is not None:
                handler = Abort(self)  # the run was stopped: another signal leaves at once
            signal.signal(signum, handler)

    @property
    def last(self) -> int | None:
        """The latest signal: its exit code is the command's."""
        return self._last

    @last.setter
    def last(self, signum: int) -> None:
        self._last = signum
        if self._command is not None:
            self._command.last = signum

    @property
    def code(self) -> int:
        """The command's exit code after the signals received: the last one's."""
        return exit_code(self.last)

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
        if self.received is not None:
            self.abort(signum)
        self.received = self.last = signum
        raise KeyboardInterrupt

    def abort(self, signum: int) -> None:
        """A signal after the run was stopped: leave at once with its exit code. In the command's own
        process, the process ends here (the journal is closed: the run's loop has ended); called from
        Python, ``KeyboardInterrupt`` is raised for the caller."""
        self.last = signum
        line = (
            f"{_name(signum)} again: leaving at once (exit {self.code}); every answer received is kept, "
            "so the same command again resumes"
        )
        if self.own_process:
            _leave(self._say, line, self.code)
        self._say(line)
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
        if self.received is not None:  # the second signal: leave now (the loop closes the run on its way out)
            self.last = signum
            self._say(f"{_name(signum)} again: aborting; the answers received so far are kept")
            raise KeyboardInterrupt
        self.received = self.last = signum
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


class Abort:
    """The handler a stopped run (or a command that is done) leaves: a signal leaves at once with its
    own exit code (``abort``)."""

    def __init__(self, owner: StopOnSignal | CommandSignals) -> None:
        self._owner = owner

    def __call__(self, signum: int, frame: Any) -> None:
        self._owner.abort(signum)
