"""Running a coroutine to completion on its own event loop in a worker thread, cancellable from any
thread: what lets the pandas accessor and the notebook apps work inside a running loop (Jupyter)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["BackgroundRun", "run_in_worker", "INTERRUPTED"]

T = TypeVar("T")
INTERRUPTED = "batchsum: interrupted"  # the cancel's message when an interrupt cancelled the run (its report: a signal)


class BackgroundRun:
    """A coroutine run to completion on its own event loop in a worker thread, so that it works
    whatever loop the caller is in; ``cancel()`` from any thread cancels it there, which lets
    requests on the wire finish and keeps their answers."""

    def __init__(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        self._make = make
        self._ready, self._finished = threading.Event(), threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._outcome: tuple[bool, Any] = (False, None)
        threading.Thread(target=self._target, name="batchsum-worker", daemon=True).start()

    async def _main(self) -> Any:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        self._ready.set()
        return await self._make()

    def _target(self) -> None:
        try:
            self._outcome = (True, asyncio.run(self._main()))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self._outcome = (False, exc)
        finally:
            self._ready.set()
            self._finished.set()

    def cancel(self, message: str | None = None) -> None:
        """Cancel the run, also when it has not reached its event loop yet; ``message`` goes with the
        ``CancelledError`` (``INTERRUPTED``: an interrupt stopped it)."""
        self._ready.wait()
        if self._loop is not None and self._task is not None and not self._task.done():
            self._loop.call_soon_threadsafe(self._task.cancel, message)

    def wait(self, timeout: float | None = None) -> bool:
        """True once the run has finished. An Event, not Thread.join(): on CPython < 3.13 an
        interrupt inside join() can leave the thread marked finished while it still runs."""
        return self._finished.wait(timeout)

    def result(self) -> Any:
        """The coroutine's result, or its exception raised here (CancelledError when cancelled)."""
        done, value = self._outcome
        if not done:
            raise value
        return value


def run_in_worker(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine in a ``BackgroundRun`` and wait; an interrupt in the calling thread cancels
    it (letting requests on the wire finish) and is re-raised."""
    run = BackgroundRun(make)
    try:
        while not run.wait(0.1):
            pass
    except KeyboardInterrupt:
        run.cancel(INTERRUPTED)
        run.wait()  # requests on the wire finish and are kept; a second interrupt leaves at once
        print(
            "batchsum: interrupted; finished answers are kept, so the same call again sends only the rest",
            file=sys.stderr,
        )
        raise
    try:
        result: T = run.result()
        return result
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
