"""``Pacer``: when each attempt of a batch may start, and what the batch tells the key's budget. It
composes the pieces of this package: the spacing rule kept with the budget (``budgets/spacing.py``),
the pause and ramp (``pause.py``), the evidence that lowers and raises the pace (``evidence.py``),
stated room (``stated_room.py``), in-flight sizing (``in_flight.py``) and the key's record
(``auto/key_record.py``); the pace in force and its changes (``paces.py``), the schedule of starts
(``turn.py``; a far budget's: ``ahead.py``), what is shared through the budget (``sharing.py``), the
key's one search (``search_lead.py``) and what answers teach (``lessons.py``).

Invariant: every start is committed (on a far budget, reserved ahead) on the key's budget with the
interval of the pace in force (times the ramp), or, on room the service stated, with the plan's
interval over ``ROOM_SPEEDUP``; so the spacing rule of ``budgets/spacing.py`` holds for every start not on
stated room, in this process and across every process sharing the budget.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass

from .ahead import FarTurn, share_of
from .auto.key_record import KeyRecord
from .auto.limit import AutoLimit
from .budgets.budget import ProcessBudget
from .budgets.exchange import Budget, Share
from .budgets.outage import hurried
from .budgets.owed import Owed
from .budgets.presence import Presence
from .evidence import Evidence
from .in_flight import InFlight
from .lessons import Answers
from .paces import PaceChange, PaceLog, Paces
from .pause import Alarm, Pause
from .search_lead import Lead
from .sharing import Sharing
from .stated_room import Company, StatedRoom, Statement
from .turn import AtTurn, Limiter, Turn, TurnGiven

__all__ = ["Pacer", "PaceChange", "PacerState", "Limiter", "PaceLog", "AtTurn", "TurnGiven"]


@dataclass(frozen=True)
class PacerState:
    """What a progress line shows: the pace, a pause and why, what is in flight."""

    rpm: float
    pace: float
    paused_for: float
    pause_reason: str | None
    in_flight: int
    in_flight_limit: int
    rate_limited: int
    limit: str | None = None  # under ``rpm="auto"``: the limit in force and where it came from
    budget: str | None = None  # the key's budget cannot be reached: the wait for it, in words

    def describe(self) -> str:
        parts = [] if self.budget is None else [self.budget]
        if self.paused_for > 0:
            parts.append(f"waiting {math.ceil(self.paused_for)} s: {self.pause_reason}")
        if self.limit is not None:
            parts.append(f"limit {self.limit}")
        parts.append(f"pace {self.pace:.0f}/min" if self.pace else "no pacing")
        parts.append(f"in flight {self.in_flight}")
        return " · ".join(parts)


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


class Pacer:
    """Shared by every sender of a batch: ``start = await before_attempt()`` before each attempt,
    ``after_attempt(start, ...)`` after it. ``rpm=0``: no pacing, but 429 pauses are still shared.

    ``limiter``: your own floor (``async acquire()``), asked before each start is reserved on the
    budget (a start reserved is never spent waiting on it). ``budget``: the key's rate budget (default: a private one in this process).
    ``on_pace_change`` is told of each ``PaceChange``. ``share``: this run may use only that fraction
    of the key's rate (``budget.Share``). ``alone``: False for one of several runs of one job at once
    (Dask partitions, Spark tasks), which never spend stated room (each would take it as its own).
    ``log``: told of starts, 429s, pauses and pace changes (``engine.timeline.Timeline``). ``record``: the
    key's record at its service (room it stated and a 429 contradicted is not trusted again; the limit
    last found). ``auto``: ``rpm`` is only a cap; the limit (``limit.AutoLimit``) stands for the plan.
    ``presence``: the run on the key's budget (its entry in the runs' registry, its job's stop).
    ``live``: a live run's (the gateway's) part of the key its starts may take ahead of the batch
    runs' reserved ones (``--interactive-share``; 0: a batch run), the key's live lane (``turn.py``)."""

    __slots__ = ("rpm", "auto", "in_flight", "_clock", "_paces", "_pause", "_sharing", "_turn", "_answers")

    def __init__(
        self,
        rpm: float,
        *,
        limiter: Limiter | None = None,
        budget: Budget | None = None,
        max_in_flight: int | None = None,
        clock: Callable[[], float] = _loop_time,
        on_pace_change: Callable[[PaceChange], None] | None = None,
        share: Share | None = None,
        alone: bool = True,
        log: PaceLog | None = None,
        record: KeyRecord | None = None,
        auto: bool = False,
        presence: Presence | None = None,
        live: float = 0.0,
    ) -> None:
        assert 0 <= live <= 1, live  # checked where it enters (the gateway's flag)
        assert not isinstance(rpm, bool) and isinstance(rpm, (int, float)) and 0 <= rpm < math.inf, rpm  # checked
        self.rpm = float(rpm)
        self.auto = AutoLimit(self.rpm, record.limit() if record is not None else None) if auto and rpm else None
        pace = self.rpm if self.auto is None else self.auto.pace()
        ceiling = self.rpm if self.auto is None else self.auto.limit()
        self._clock = clock
        budget = budget if budget is not None else ProcessBudget(clock)
        share = share if share is not None and share.fraction < 1 else None
        owed, alarm = Owed(), Alarm()
        self._paces = paces = Paces(self.rpm, pace, ceiling, owed, log, on_pace_change)
        self._pause = pause = Pause()
        evidence, company = Evidence(budget.shared), Company(budget.shared)
        room = StatedRoom(trusted=record is None or not record.room_distrusted)
        self._sharing = Sharing(clock, budget, share, paces, pause, evidence, company, alarm, record, owed, presence)
        turn = FarTurn if budget.far else Turn  # a far budget: starts reserved ahead, a few at a time
        self._turn = turn(
            clock, paces, pause, room, company, evidence, self._sharing, alarm, self.auto, limiter, share, alone, live
        )
        self.in_flight = InFlight(self, max_in_flight)
        if isinstance(self._turn, FarTurn):
            self._turn.in_flight = self.in_flight
        last_start = lambda: self._turn.last_start  # noqa: E731
        lead = None if self.auto is None else Lead(clock, budget, self.auto, paces, self._sharing, record, last_start)
        self._answers = Answers(clock, paces, pause, evidence, room, self._sharing, alarm, self.in_flight, lead, record)

    @property
    def leading(self) -> bool:
        """Under auto, whether this run leads its key's search (the others follow it)."""
        return self._answers.lead is not None and self._answers.lead.leading

    @property
    def pace(self) -> float:
        """The pace in force."""
        return self._paces.pace

    @property
    def ceiling(self) -> float:
        """``rpm``, or lower when the service's headers state a lower limit; under auto the limit in force."""
        return self._paces.ceiling

    @property
    def changes(self) -> list[PaceChange]:
        return self._paces.changes

    @property
    def rate_limited(self) -> int:
        """429s seen."""
        return self._answers.rate_limited

    @property
    def share(self) -> float:
        """The fraction of the key's rate this run may use (``share``; 1: all of it)."""
        share = self._sharing.share
        return share.fraction if share is not None else 1.0

    @property
    def interval(self) -> float:
        """Seconds between starts at the pace in force (0 without pacing)."""
        return self._paces.interval

    @property
    def rate(self) -> float:
        """Starts per second at the pace in force."""
        return self._paces.rate

    def now(self) -> float:
        return self._clock()

    @property
    def job_stop(self) -> str | None:
        """The cause of the stop its run's job was given (``Budget.post_stop``), once heard: no attempt starts."""
        presence = self._sharing.presence
        return presence.stop if presence is not None else None

    async def before_attempt(self, at_turn: AtTurn | None = None) -> float:
        """Wait for this attempt's turn; returns the time it starts (pass it to ``after_attempt``).
        ``at_turn``: asked before the start is committed; a no raises ``TurnGiven`` (``turn.py``)."""
        if self._answers.lead is not None:
            await self._answers.lead.start()  # under auto: the key's level before the first start
        return await self._turn.take(at_turn)

    def turn_in(self, waiting: int) -> float:
        """Seconds until the start of the last of ``waiting`` attempts waiting for a turn now (what a
        gateway's 429 says in Retry-After): the shared pause, then the interval in force (wider during
        the ramp; a share's, on a share) after the last start this pacer made (a live run's first
        turn is the key's next start), then one each at this run's part of the key's starts: all of
        them alone on the key (or on a share: its own interval), else its part of the last minute's, at least
        its live part."""
        now = self._clock()
        turn = self._turn
        interval = self._paces.interval * self._pause.ramp
        if turn.share is not None:
            interval = turn.share.own_interval(interval)
        first = max(self._pause.left(now), turn.last_start + interval - now, 0.0)
        # A share's own interval is its part of the key already: not divided by it twice.
        alone = turn.share is not None or turn.company.alone(now)
        part = 1.0 if alone else max(turn.live, share_of(turn.evidence, now))
        return first + max(0, waiting - 1) * interval / part

    def room_left(self, now: float) -> int:
        """Starts the service's headers still allow before their reset, beyond the pace, ours to use."""
        return self._turn.room_left(now)

    async def flush(self) -> None:
        """Tell the budget what it has not heard yet (the last starts, a pause, a pace) and write the
        key's record: at the end of a batch, so that others' counts are whole. Under auto, the lead
        of the key's search, if this batch held it, goes to another run. A budget out now is not
        waited for: these are a run's last words."""
        with hurried():
            await self._turn.close()
            if self._answers.lead is not None:
                await self._answers.lead.close()
            await self._sharing.flush(self._turn.last_start)

    def after_attempt(
        self,
        started_at: float,
        *,
        rate_limited: bool = False,
        retry_after: float | None = None,
        answered: bool = True,
        headers: Statement | None = None,
    ) -> None:
        """The attempt that started at ``started_at`` ended: answered 429 (``rate_limited``, with the
        service's ``retry_after``), answered otherwise, or not answered at all (``answered=False``:
        cancelled, timed out, connection lost). ``headers``: what its rate-limit headers state."""
        now = self._clock()
        self._answers.ended(started_at, now, rate_limited, retry_after, answered, headers)
        if self.room_left(now):
            self.in_flight._wake()  # room to use at once: waiters for a slot in flight may go

    def state(self) -> PacerState:
        """What a progress line shows."""
        now = self._clock()
        paused_for, reason = self._pause.left(now), self._pause.reason
        if (wait := self._turn.room.reset_wait(now)) > paused_for:
            paused_for, reason = wait, "the room the service stated is used up until its reset"
        return PacerState(
            rpm=self.rpm,
            pace=self.pace,
            paused_for=paused_for,
            pause_reason=reason,
            in_flight=self.in_flight.on_wire,
            in_flight_limit=self.in_flight.limit(now),
            rate_limited=self.rate_limited,
            limit=self.auto.describe() if self.auto is not None else None,
            budget=self._sharing.budget.outage.describe(),
        )
