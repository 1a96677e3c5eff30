"""The gate every attempt passes (``Gate``: the client's attempt hooks): the request cap's count, a
slot in flight, the pacer's turn; and what a stop must know: the tasks on the wire, nothing new starts."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from ..pacing import Pacer
from ..service.errors import APIError, APIResponseValidationError, APIStatusError, RateLimitError, RequestCapReached
from ..service.rate_headers import RateStatement
from ..service.settings import DEFAULT_MAX_WAIT
from .tally import BatchStats

__all__ = ["Gate"]


class Gate:
    """The client's attempt hooks: the request cap's count, a slot in flight, then the pacer's turn;
    and what the engine must know when it stops: which tasks have a request on the wire, and that
    nothing new starts.

    The cap counts paid requests: an attempt claims one before it waits for its turn, and a 429
    gives it back (the service said "later": not paid). When the cap is used up the attempt waits
    while claimed attempts may still give one back; when none can, ``on_cap`` stops the batch."""

    __slots__ = (
        "pacer",
        "max_wait",
        "closing",
        "on_wire",
        "_ids",
        "stats",
        "cap",
        "paid",
        "claims",
        "on_cap",
        "_settled",
    )

    def __init__(
        self,
        pacer: Pacer,
        max_wait: float = DEFAULT_MAX_WAIT,
        *,
        stats: BatchStats | None = None,
        cap: int | None = None,
        on_cap: Callable[[RequestCapReached], None] | None = None,
    ) -> None:
        self.pacer = pacer
        self.max_wait = max_wait
        self.closing = False
        self.on_wire: set[asyncio.Task[Any]] = set()
        self._ids = itertools.count()
        self.stats = stats
        self.cap = cap
        self.paid = 0  # paid requests claimed (started or about to start), 429s given back
        self.claims = 0  # claims whose attempt has not ended yet: each may still give one back
        self.on_cap = on_cap
        self._settled: asyncio.Event | None = None

    async def _claim(self) -> None:
        assert self.cap is not None
        while self.paid >= self.cap:
            if self.closing:
                raise asyncio.CancelledError
            if not self.claims:
                if self.on_cap is not None:
                    self.on_cap(RequestCapReached(self.cap))
                raise asyncio.CancelledError
            if self._settled is None:
                self._settled = asyncio.Event()
            self._settled.clear()
            await self._settled.wait()
        self.paid += 1
        self.claims += 1

    def _settle(self, paid: bool) -> None:
        self.claims -= 1
        if not paid:
            self.paid -= 1
        if self._settled is not None:
            self._settled.set()

    async def before_attempt(self) -> tuple[int, float, asyncio.Task[Any] | None]:
        if self.closing:
            raise asyncio.CancelledError
        if self.cap is not None:
            await self._claim()
        in_flight = self.pacer.in_flight
        try:
            await in_flight.acquire()
        except BaseException:
            if self.cap is not None:
                self._settle(paid=False)
            raise
        try:
            started = await self.pacer.before_attempt()
            if self.closing:
                raise asyncio.CancelledError
        except BaseException:
            in_flight.release()
            if self.cap is not None:
                self._settle(paid=False)
            raise
        attempt, task = next(self._ids), asyncio.current_task()
        in_flight.started(attempt, started)
        if task is not None:
            self.on_wire.add(task)
        if self.stats is not None:
            self.stats.attempt_started(in_flight.on_wire)
        return attempt, started, task

    def after_attempt(
        self,
        ticket: tuple[int, float, asyncio.Task[Any] | None],
        error: BaseException | None,
        limits: RateStatement | None,
    ) -> None:
        attempt, started, task = ticket
        if task is not None:
            self.on_wire.discard(task)
        # An answer of any kind says how long the service takes; a timeout or a lost connection does not.
        answered = error is None or isinstance(error, (APIStatusError, APIResponseValidationError))
        self.pacer.in_flight.finished(attempt, answered)
        if self.cap is not None:
            self._settle(paid=not isinstance(error, RateLimitError))
        if self.stats is not None:
            latency = self.pacer.now() - started if answered else None
            self.stats.attempt_ended(_outcome(error), latency, self.pacer.in_flight.on_wire)
        self.pacer.after_attempt(
            started,
            rate_limited=isinstance(error, RateLimitError),
            retry_after=error.retry_after if isinstance(error, RateLimitError) else None,
            answered=answered,
            headers=limits,
        )


def _outcome(error: BaseException | None) -> str:
    """An attempt's outcome, as the report and the metrics name it."""
    if error is None:
        return "ok"
    if isinstance(error, RateLimitError):
        return "rate_limited"
    if isinstance(error, APIError):
        return error.code
    return "cancelled"
