"""Why a batch stopped (``Stop``: the first error noticed) and what its rows get then: a record each
(``NOT_SENT``) or the error raised; the answers on the wire waited for within the drain time."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..data.results import FAILED, RowResult
from ..service.errors import AuthenticationError, BatchsumError, NotPremiumError, RequestCapReached
from ._window import Pending, as_row

__all__ = ["NOT_SENT", "Stop"]

NOT_SENT = "not_sent"  # the error code of a row a stop left unsent (a rerun sends it)


class Stop:
    """A batch's stop: set once, whoever notices first (nothing new starts from then on: the batch
    closes its gate); its error, raised once the rows read are yielded; with ``unsent_rows``, the rows
    already read still get a record each (``failed``, ``not_sent``) before it is raised."""

    __slots__ = ("stopped", "fatal", "unsent_rows", "on_wire", "drain_seconds", "_deadline")

    def __init__(self, on_wire: set[asyncio.Task[Any]], drain_seconds: float) -> None:
        self.stopped = asyncio.Event()
        self.fatal: BatchsumError | None = None
        self.unsent_rows = False
        self.on_wire = on_wire  # the gate's tasks with a request on the wire
        self.drain_seconds = drain_seconds
        self._deadline: float | None = None  # when the stop stops waiting for answers on the wire

    def set(self, error: BatchsumError, *, unsent_rows: bool = False) -> None:
        """The batch stops; the first error is the stop's."""
        if self.fatal is None:
            self.fatal = error
            self.unsent_rows = unsent_rows
        self.stopped.set()

    @property
    def read_on(self) -> bool:
        """After the cap: read every row still, so each gets its record. Only when the cap was the
        stop: once stopped, the gate starts nothing new, and the cap is not reached after that."""
        return isinstance(self.fatal, RequestCapReached)

    def not_sent(self) -> RowResult:
        message = f"not sent: the run stopped ({self.fatal}); a rerun sends it"
        return RowResult(None, FAILED, NOT_SENT, message, None, 0, 0)

    def drains(self) -> bool:
        """Does this stop wait for answers on the wire? Not when the key or plan was refused:
        those answers would be refusals too."""
        return not isinstance(self.fatal, (AuthenticationError, NotPremiumError))

    async def next_result(self, head: Pending, stop_waiter: asyncio.Future[Any]) -> RowResult:
        """The head row's result. After a stop, a head on the wire is still awaited (within the
        drain time) for its answer; a head that never reached the wire raises the stop's error."""
        if not isinstance(head, asyncio.Task):
            return as_row(head)
        if not head.done() and not self.stopped.is_set():
            await asyncio.wait({head, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
        # A stop has already stopped sending: only a head on the wire is still worth waiting for.
        if not head.done() and self.drains() and head in self.on_wire:
            if self._deadline is None:
                self._deadline = time.monotonic() + self.drain_seconds
            await asyncio.wait({head}, timeout=max(0.0, self._deadline - time.monotonic()))
        if head.done() and not head.cancelled() and head.exception() is None:
            return as_row(head.result())
        if self.fatal is not None and self.unsent_rows:
            return self.not_sent()
        if self.fatal is not None:
            raise self.fatal
        return as_row(head.result())  # the task's own error
