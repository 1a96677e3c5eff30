"""How many attempts may be under way at once (queued for their turn or on the wire): Little's law,
the pace's rate x the latency, with headroom.

Invariants: at most ``limit(now)`` slots are held, and the limit is at least 1 and at most ``cap``;
slots go in the order asked, except that a retry goes before first attempts; the limit never
depends on anything but the rate, the latency seen and the room stated, so it can only let the
pacer's own spacing decide when a start goes.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections import deque
from typing import Protocol

__all__ = ["InFlight", "Rated", "DEFAULT_MAX_IN_FLIGHT", "UNPACED_IN_FLIGHT", "START_IN_FLIGHT"]

DEFAULT_MAX_IN_FLIGHT = 512  # the safety ceiling of automatic in-flight sizing
UNPACED_IN_FLIGHT = 16  # without a pace there is no rate to size from
START_IN_FLIGHT = 8  # before any latency is known
HEADROOM = 1.5  # in flight = rate x latency x headroom + SPARE
SPARE = 4
LATENCY_SAMPLES = 50


class Rated(Protocol):
    """What the in-flight limit reads of the pacer."""

    rpm: float

    @property
    def rate(self) -> float: ...

    @property
    def interval(self) -> float: ...

    def now(self) -> float: ...

    def room_left(self, now: float) -> int: ...


class InFlight:
    """How many attempts may hold a slot (queued for their turn or on the wire): the pacer's rate x
    the latency (Little's law) x headroom, at least ``START_IN_FLIGHT``, at most ``cap``. FIFO, but
    a retry goes before first attempts (the rows after it wait in order behind it)."""

    __slots__ = ("cap", "held", "_pacer", "_wire", "_latencies", "_waiters", "_timer", "_tried")

    def __init__(self, pacer: Rated, cap: int | None) -> None:
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"invalid concurrency {cap!r}: use a whole number >= 1, or None for automatic")
        self._pacer = pacer
        if cap is None:
            cap = DEFAULT_MAX_IN_FLIGHT if pacer.rpm else UNPACED_IN_FLIGHT
        self.cap = cap
        self.held = 0
        self._wire: dict[int, float] = {}  # attempt id -> start time
        self._latencies: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self._waiters: deque[asyncio.Future[None]] = deque()
        # Tasks that already made an attempt: a retry waits at the front, not behind every row not
        # yet sent (the rows after it wait in order behind it).
        self._tried: weakref.WeakSet[asyncio.Task[object]] = weakref.WeakSet()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def on_wire(self) -> int:
        return len(self._wire)

    def wire(self) -> list[float]:
        """The start times of the attempts on the wire."""
        return list(self._wire.values())

    def latency(self, now: float) -> float:
        """The latency to size for: the longest recent answer, or the oldest attempt still unanswered."""
        recent = max(self._latencies, default=0.0)
        oldest = now - min(self._wire.values(), default=now)
        return max(recent, oldest)

    def limit(self, now: float) -> int:
        rate = self._pacer.rate
        if not rate:
            return self.cap
        wanted = math.ceil(rate * self.latency(now) * HEADROOM) + SPARE
        room = self._pacer.room_left(now)
        if room:  # the room the service stated is used at once, within the cap
            wanted = max(wanted, len(self._wire) + room)
        return max(1, min(self.cap, max(START_IN_FLIGHT, wanted)))

    async def acquire(self) -> None:
        if not self._waiters and self.held < self.limit(self._pacer.now()):
            self.held += 1
            return
        future = asyncio.get_running_loop().create_future()
        task = asyncio.current_task()
        if task is not None and task in self._tried:
            self._waiters.appendleft(future)
        else:
            self._waiters.append(future)
        self._arm()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot was given as we were cancelled: hand it on
            raise

    def release(self) -> None:
        self.held -= 1
        self._wake()

    def started(self, attempt: int, at: float) -> None:
        self._wire[attempt] = at
        task = asyncio.current_task()
        if task is not None:
            self._tried.add(task)

    def finished(self, attempt: int, answered: bool) -> None:
        start = self._wire.pop(attempt, None)
        if start is not None and answered:
            self._latencies.append(max(0.0, self._pacer.now() - start))
        self.release()

    def _wake(self) -> None:
        now = self._pacer.now()
        while self._waiters and self.held < self.limit(now):
            future = self._waiters.popleft()
            if not future.done():
                self.held += 1
                future.set_result(None)
        self._arm()

    def _arm(self) -> None:
        """While some wait, look again as time passes: the oldest attempt's age raises the limit."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiters:
            recheck = min(1.0, max(0.05, self._pacer.interval or 0.25))
            self._timer = asyncio.get_running_loop().call_later(recheck, self._wake)
