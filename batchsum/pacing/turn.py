"""When each attempt of a batch starts: its turn reserved on the key's budget, waited for and then
committed (the budget checks the spacing), at the pace's interval or on the room the service stated.
A limiter of the user's (their own floor under the pace) is asked before the start is reserved, on
every budget: a start reserved is never spent waiting on it.

An attempt may be asked, when its turn has come and before it is committed, whether it still goes
(``at_turn``: the engine claims its text then). One that does not (its text is claimed by another run)
raises ``TurnGiven``, and its reserved start goes to the next attempt to take a turn: nothing is
committed for it, so nothing is counted as sent.

A live run's turn (``live``: the gateway's, its part of the key ahead of the batch runs) is reserved
as the live lane's: the key's next start, ahead of the batch runs' reserved ones, while the lane has
room (``budgets/gcra.py``); its commit says so. A batch run whose reserved start a live one took has
its commit refused and commits an interval later: the same attempt, in its place.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from .auto.limit import AutoLimit
from .budgets.exchange import COMMIT, LOOK, RESERVE, Share
from .budgets.spacing import ROOM_SPEEDUP, interval_of
from .evidence import Evidence
from .paces import Paces
from .pause import ON_TIME, Alarm, Pause
from .sharing import Sharing
from .stated_room import Company, StatedRoom

__all__ = ["Turn", "Limiter", "TurnGiven", "AtTurn"]

MINUTE_LOOK = 0.5  # a turn held by a full minute looks at the key's count again this often


AtTurn = Callable[[], Awaitable[bool]]  # asked when an attempt's turn has come: does it still go?


class TurnGiven(Exception):
    """The attempt does not go (``at_turn`` said no): its reserved start went to the next attempt."""


class Limiter(Protocol):
    """Anything that spaces starts: ``await acquire()`` returns when one may start."""

    async def acquire(self) -> object: ...


@dataclass(eq=False, slots=True)
class Turn:
    """The schedule of starts: one caller at a time takes a turn (FIFO, one reservation), reserved on
    the budget, waited for, then committed there (the budget checks the spacing against every
    process's last start); ``limiter``, the user's own floor, is asked before the start is reserved
    (``floor``). Room the service states is spent only by a run alone on its budget with the whole key."""

    clock: Callable[[], float]
    paces: Paces
    pause: Pause
    room: StatedRoom
    company: Company
    evidence: Evidence
    sharing: Sharing
    alarm: Alarm
    auto: AutoLimit | None
    limiter: Limiter | None
    share: Share | None
    alone: bool
    live: float = 0.0  # a live run's part of the key ahead of the batch runs (``--interactive-share``); 0: a batch run
    last_start: float = -math.inf
    lock: asyncio.Lock | None = field(default=None, init=False)
    given: bool | None = field(default=None, init=False)  # a reserved start given on: on stated room?
    floored: bool = field(default=False, init=False)  # the limiter let the next start go (kept when it is given on)
    first: bool = field(default=False, init=False)  # the start in hand was reserved ahead of the batch runs

    async def take(self, at_turn: AtTurn | None = None) -> float:
        """Wait for this attempt's turn; the time it starts. ``at_turn``: asked once the turn has come,
        before the start is committed; False gives the reserved start to the next attempt
        (``TurnGiven`` raised here)."""
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:  # one caller at a time takes a turn: FIFO order, one reservation
            await self.floor()
            interval, on_room = await self._take_turn(at_turn)
            self.floored = self.first = False
        now = self.clock()
        self._started(now, interval, on_room)
        return now

    async def floor(self) -> None:
        """The user's limiter asked for the next start, before anything is reserved for it: once per
        start (an attempt that gives its turn on gives the limiter's leave with it)."""
        if self.limiter is not None and not self.floored:
            await self.limiter.acquire()
            self.floored = True

    async def _take_turn(self, at_turn: AtTurn | None) -> tuple[float, bool]:
        """Reserve the next start on the budget (or take the one an attempt before gave on), wait for
        it, ask ``at_turn``, then commit it (the budget checks the spacing against every process's
        last start); the interval it was committed with, and whether it is on stated room. A pause
        that begins meanwhile sends it back to reserve."""
        while True:
            given, self.given = self.given, None
            if given is None:
                reserved = await self._reserve(commit=at_turn is None)
                if reserved is None:
                    continue  # this run's share: its own turn has come, now take the key's next slot
                interval, on_room, committed = reserved
                if committed:
                    return interval, on_room
            else:
                interval, on_room = self._spacing(self.clock())
                on_room = on_room and given
            if at_turn is not None and not await at_turn():
                self.given = on_room
                raise TurnGiven
            while not self.pause.paused(self.clock()):
                interval, still = self._spacing(self.clock())
                on_room = on_room and still
                slot = await self.sharing.exchange(
                    COMMIT, interval, self.last_start, live=self.live if self.first else 0.0
                )
                if slot.committed:
                    return interval, on_room
                await self.alarm.nap(slot.wait)  # another start went out meanwhile, or a pause began

    async def _reserve(self, *, commit: bool) -> tuple[float, bool, bool] | None:
        """The next start reserved on the budget and waited for: its interval, whether it is on
        stated room, and whether it is committed already (due at once, and ``commit``); None when a
        shared run's own turn had not come (ask again)."""
        while (wait := self.room.reset_wait(self.clock())) > ON_TIME:
            await self.alarm.nap(min(wait, 1.0))  # used up: wait for the reset, or a newer statement
        while self._minute_full():
            await self.alarm.nap(MINUTE_LOOK)
            await self.sharing.exchange(LOOK, 0.0, self.last_start)
        interval, on_room = self._spacing(self.clock())
        slot = await self.sharing.exchange(RESERVE, interval, self.last_start, commit=commit, live=self.live)
        self.first = slot.live
        if slot.deferred:
            await self.alarm.nap(slot.wait)
            return None
        if slot.committed:
            return interval, on_room, True
        if slot.wait > ON_TIME:
            await self.alarm.nap(slot.wait)
        return interval, on_room, False

    async def close(self) -> None:
        """Let go of what the schedule holds (nothing here; a far budget's reservation under way)."""

    def _minute_full(self) -> bool:
        """Under auto, whether the key's starts of the trailing minute (every process's, less those
        refused) already reach the limit in force. After a search's burst, a per-minute window is full
        of it: the next starts wait for what leaves it, not for a 429 to say so."""
        seen = self.evidence.seen
        if self.auto is None or not self.paces.pace or seen is None:
            return False
        return seen.starts - seen.refused >= self.auto.minute_cap()

    def _spacing(self, now: float) -> tuple[float, bool]:
        """The interval to start with, and whether it is on stated room: the pace's (wider during
        the ramp), or the plan's over ``ROOM_SPEEDUP`` while the service states room ours to use."""
        normal = self.paces.interval * self.pause.ramp
        if not self.paces.pace or self.pause.paused(self.clock()) or self.room_left(now) <= 0:
            return normal, False
        return min(normal, interval_of(self.paces.ceiling) / ROOM_SPEEDUP), True

    def room_left(self, now: float) -> int:
        """Starts the service's headers still allow before their reset, beyond the pace (0: none
        stated, used up, expired, untrusted, or not ours to use: another user on the budget, a share,
        one of several runs of a job)."""
        if self.share is not None or not self.alone or not self.company.alone(now):
            return 0
        return self.room.left(now)

    def _started(self, now: float, interval: float, on_room: bool) -> None:
        self.last_start = now
        self.room.used(now)
        if on_room:
            self.room.spent(now)
        self.company.started(now, interval)
        self.paces.log.started(now)
        self.evidence.started(now)
        if self.paces.pace:
            self.pause.started(now)
