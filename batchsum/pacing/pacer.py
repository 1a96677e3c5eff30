"""``Pacer``: when each attempt of a batch may start, and what the batch tells the key's budget. It
composes the pieces of this package: the spacing rule kept with the budget (``spacing.py``), the
pause and ramp (``pause.py``), the evidence that lowers and raises the pace (``evidence.py``), stated
room (``room.py``), in-flight sizing (``in_flight.py``) and the key's record (``record.py``).

Invariant: every start is committed on the key's budget with the interval of the pace in force (times
the ramp), or, on room the service stated, with the plan's interval over ``ROOM_SPEEDUP``; so the
spacing rule of ``spacing.py`` holds for every start not on stated room, in this process and across
every process sharing the budget.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..run.spec import check_rpm
from .budget import COMMIT, LOOK, RESERVE, Budget, ProcessBudget, Report, Share, Slot
from .evidence import Evidence, count_between
from .in_flight import InFlight
from .limit import AutoLimit
from .pause import ON_TIME, Pause
from .record import KeyRecord
from .room import Company, StatedRoom, Statement
from .spacing import MIN_RPM, ROOM_SPEEDUP, WINDOW, interval_of

__all__ = ["Pacer", "PaceChange", "PacerState", "Limiter", "PaceLog"]


class Limiter(Protocol):
    """Anything that spaces starts: ``await acquire()`` returns when one may start."""

    async def acquire(self) -> object: ...


class PaceLog(Protocol):
    """What the pacer tells of what it does (``report.Timeline`` keeps it second by second)."""

    def started(self, now: float) -> None: ...

    def refused(self, now: float) -> None: ...

    def paused(self, now: float, until: float, why: str) -> None: ...

    def pace_changed(self, now: float, pace: float) -> None: ...


class _Unlogged:
    def started(self, now: float) -> None:
        pass

    def refused(self, now: float) -> None:
        pass

    def paused(self, now: float, until: float, why: str) -> None:
        pass

    def pace_changed(self, now: float, pace: float) -> None:
        pass


@dataclass(frozen=True)
class PaceChange:
    """A change of the pace in force, reported once with its reason."""

    at: float
    pace: float
    previous: float
    reason: str

    def __str__(self) -> str:
        if self.pace == self.previous:
            return f"pace kept at {self.pace:g}/min: {self.reason}"
        verb = "lowered" if self.pace < self.previous else "raised"
        return f"pace {verb} to {self.pace:g}/min: {self.reason}"


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

    def describe(self) -> str:
        parts = []
        if self.paused_for > 0:
            parts.append(f"waiting {math.ceil(self.paused_for)} s: {self.pause_reason}")
        if self.limit is not None:
            parts.append(f"limit {self.limit}")
        parts.append(f"pace {self.pace:.0f}/min" if self.pace else "no pacing")
        parts.append(f"in flight {self.in_flight}")
        return " · ".join(parts)


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


class _Owed:
    """What a pacer owes its budget, told with its next exchange (its own pause, the pace it set,
    the starts and 429s since), and what it last saw there (to tell others' news from its own)."""

    __slots__ = ("pause", "pace", "started", "refused", "seen", "pace_version", "pause_mark")

    def __init__(self) -> None:
        self.pause = False  # our own pause, not yet told
        self.pace: str | None = None  # our own pace, not yet told: "lowered" (always applies) or "climbed"
        self.started = 0
        self.refused = 0
        self.seen: Slot | None = None  # the budget's state at the last exchange
        self.pace_version = 0
        self.pause_mark: float | None = None

    def __bool__(self) -> bool:
        return bool(self.pause or self.pace or self.started or self.refused)

    def take(self, pause_for: float, pause_reason: str | None, pace: float | None) -> Report:
        """The report of what is owed (``pace``: the pace in force, None without pacing); owed no more."""
        report = Report(
            pause_for=pause_for if self.pause else 0.0,
            pause_reason=pause_reason if self.pause else None,
            pace=pace if self.pace else None,
            pace_base=self.pace_version if self.pace == "climbed" else None,
            started=self.started,
            refused=self.refused,
        )
        self.pause, self.pace, self.started, self.refused = False, None, 0, 0
        return report


class Pacer:
    """Shared by every sender of a batch: ``start = await before_attempt()`` before each attempt,
    ``after_attempt(start, ...)`` after it. ``rpm=0``: no pacing, but 429 pauses are still shared.

    ``limiter``: your own floor (``async acquire()``), asked right before each start is committed on
    the budget. ``budget``: the key's rate budget (default: a private one in this process).
    ``on_pace_change`` is told of each ``PaceChange``. ``share``: this run may use only that fraction
    of the key's rate (``budget.Share``). ``alone``: False for one of several runs of one job at once
    (Dask partitions, Spark tasks), which never spend stated room (each would take it as its own).
    ``log``: told of starts, 429s, pauses and pace changes (``report.Timeline``). ``record``: the
    key's record at its service (room it stated and a 429 contradicted is not trusted again; the
    limit last found). ``auto``: ``rpm`` is only a cap; the limit is stated by the service,
    remembered, or found (``limit.AutoLimit``), and stands for the plan in every rule here.
    """

    __slots__ = (
        "rpm",
        "pace",
        "ceiling",
        "rate_limited",
        "changes",
        "in_flight",
        "_clock",
        "_wake",
        "_limiter",
        "_budget",
        "_share",
        "_alone",
        "_owed",
        "_turn",
        "_pause",
        "_evidence",
        "_room",
        "_company",
        "_record",
        "_log",
        "_on_pace_change",
        "_last_start",
        "_room_starts",
        "auto",
        "_paces",
    )

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
    ) -> None:
        self.rpm = check_rpm(rpm)
        self.auto = AutoLimit(self.rpm, record.limit() if record is not None else None) if auto and rpm else None
        self.pace = self.rpm if self.auto is None else self.auto.pace()  # the pace in force
        # rpm, or lower when the service's headers state a lower limit; under auto the limit in force
        self.ceiling = self.rpm if self.auto is None else self.auto.limit()
        self.rate_limited = 0  # 429s seen
        self.changes: list[PaceChange] = []
        self._clock = clock
        self._wake: asyncio.Event | None = None  # set when our own 429 pauses us: a sleeping turn rechecks
        self._limiter = limiter
        self._budget = budget if budget is not None else ProcessBudget(clock)
        self._share = share if share is not None and share.fraction < 1 else None
        self._alone = alone
        self._owed = _Owed()
        self._turn: asyncio.Lock | None = None
        self._pause = Pause()
        self._evidence = Evidence(self._budget.shared)
        self._room = StatedRoom(trusted=record is None or not record.room_distrusted)
        self._company = Company(self._budget.shared)
        self._record = record
        self._log: PaceLog = log if log is not None else _Unlogged()
        self._on_pace_change = on_pace_change
        self._last_start = -math.inf
        self._room_starts: deque[float] = deque()  # start times of the last minutes' starts on stated room
        self._paces: deque[tuple[float, float]] = deque([(-math.inf, self.pace)])  # (since, pace), two minutes
        self.in_flight = InFlight(self, max_in_flight)

    # -- the turn ------------------------------------------------------------------------------

    @property
    def interval(self) -> float:
        """Seconds between starts at the pace in force (0 without pacing)."""
        return interval_of(self.pace)

    @property
    def rate(self) -> float:
        """Starts per second at the pace in force."""
        return self.pace / WINDOW

    def now(self) -> float:
        return self._clock()

    async def before_attempt(self) -> float:
        """Wait for this attempt's turn; returns the time it starts (pass it to ``after_attempt``)."""
        if self._turn is None:
            self._turn = asyncio.Lock()
        async with self._turn:  # one caller at a time takes a turn: FIFO order, one reservation
            interval, on_room = await self._take_turn()
        now = self._clock()
        self._started(now, interval, on_room)
        return now

    async def _take_turn(self) -> tuple[float, bool]:
        """Reserve the next start on the budget, wait for it, then commit it (the budget checks the
        spacing against every process's last start); the interval it was committed with, and
        whether it is on stated room. A pause that begins meanwhile sends it back to reserve."""
        while True:
            while (wait := max(self._room.reset_wait(self._clock()), self._minute_full())) > ON_TIME:
                await self._nap(min(wait, 1.0))  # used up: wait for the reset, or a newer statement
            interval, on_room = self._spacing(self._clock())
            # With a limiter of the user's, no start is committed before it has been asked.
            slot = await self._exchange(RESERVE, interval, commit=self._limiter is None)
            if slot.deferred:
                await self._nap(slot.wait)
                continue  # this run's share: its own turn has come, now take the key's next slot
            if slot.committed:
                return interval, on_room
            if slot.wait > ON_TIME:
                await self._nap(slot.wait)
            if self._limiter is not None:
                await self._limiter.acquire()
            while not self._paused():
                interval, still = self._spacing(self._clock())
                on_room = on_room and still
                slot = await self._exchange(COMMIT, interval)
                if slot.committed:
                    return interval, on_room
                await self._nap(slot.wait)  # another start went out meanwhile, or a pause began

    def _minute_full(self) -> float:
        """Under auto, how long until our starts of the trailing minute are under the limit in force
        (0: they are). After a search's burst, a per-minute window is full of it: the next starts
        wait for what leaves it, not for a 429 to say so."""
        if self.auto is None or not self.pace:
            return 0.0
        now, starts = self._clock(), self._evidence.starts
        allowed = max(1, math.floor(self.auto.limit() * 0.99))
        recent = len(starts) - count_between(starts, -math.inf, now - WINDOW)
        return starts[-allowed] + WINDOW - now if recent >= allowed else 0.0

    def _spacing(self, now: float) -> tuple[float, bool]:
        """The interval to start with, and whether it is on stated room: the pace's (wider during
        the ramp), or the plan's over ``ROOM_SPEEDUP`` while the service states room ours to use."""
        normal = self.interval * self._pause.ramp
        if not self.pace or self._paused() or self.room_left(now) <= 0:
            return normal, False
        return min(normal, interval_of(self.ceiling) / ROOM_SPEEDUP), True

    def room_left(self, now: float) -> int:
        """Starts the service's headers still allow before their reset, beyond the pace (0: none
        stated, used up, expired, untrusted, or not ours to use: another user on the budget, a share,
        one of several runs of a job)."""
        if self._share is not None or not self._alone or not self._company.alone(now):
            return 0
        return self._room.left(now)

    def _paused(self) -> bool:
        return self._pause.paused(self._clock())

    async def _nap(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when a 429 pauses us meanwhile (to share the pause at once)."""
        self._wake = wake = asyncio.Event()
        try:
            await asyncio.wait_for(wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        finally:
            self._wake = None

    async def _exchange(self, what: int, interval: float, *, commit: bool = True) -> Slot:
        """One call to the budget (``LOOK``, ``RESERVE`` or ``COMMIT``), telling it what it must share
        and adopting what others told it; the key's record written when it has news."""
        before = self._clock()
        report = self._owed.take(self._pause.left(before), self._pause.reason, self.pace if self.rpm else None)
        if what == RESERVE:
            slot = await self._budget.reserve(interval, report, share=self._share, commit=commit)
        elif what == COMMIT:
            slot = await self._budget.commit(interval, report)
        else:
            slot = await self._budget.reserve(0.0, report, start=False)
        floor = max(self._pause.until, self._last_start + interval)
        self._company.look(slot, before, self._evidence.starts, interval if what == RESERVE else None, floor)
        self._evidence.seen = slot
        self._adopt(slot, report)
        if self._record is not None and self._record.pending:
            await self._record.flush()
        return slot

    async def flush(self) -> None:
        """Tell the budget what it has not heard yet (the last starts, a pause, a pace) and write the
        key's record: at the end of a batch, so that others' counts are whole."""
        if self._owed:
            await self._exchange(LOOK, 0.0)
        if self._record is not None:
            await self._record.flush()

    def _adopt(self, slot: Slot, report: Report) -> None:
        """Take on a pause or a pace another user of the budget set."""
        now = self._clock()
        owed = self._owed
        owed.seen = slot
        if slot.paused_for > 0 and slot.pause_mark != owed.pause_mark:
            owed.pause_mark = slot.pause_mark
            if not report.pause_for:  # someone else's pause
                reason = slot.pause_reason or "another process sharing the budget got a 429"
                self._hold(now + slot.paused_for, reason, publish=False)
        if self.rpm and slot.pace is not None and slot.pace_version != owed.pace_version:
            owed.pace_version = slot.pace_version
            pace = max(MIN_RPM, min(self.ceiling, slot.pace))
            if slot.pace != report.pace and abs(pace - self.pace) >= 0.5:  # someone else's pace
                if pace < self.pace:  # lowered on their evidence of a limit about where it now is
                    self._evidence.another_lowered(pace, now)
                    self._set_pace(pace, "another process sharing the rate budget lowered it", now, publish=False)
                else:
                    self._set_pace(pace, None, now, publish=False)
                self._evidence.last_climb = now  # climb from here, not again over what they climbed

    def _started(self, now: float, interval: float, on_room: bool) -> None:
        if self.auto is not None:
            self.auto.start(now)
        self._last_start = now
        self._room.used(now)
        if on_room:
            self._room_starts.append(now)
            while self._room_starts[0] < now - 2 * WINDOW:
                self._room_starts.popleft()
        self._company.started(now, interval)
        self._log.started(now)
        self._owed.started += 1
        self._evidence.started(now)
        if self.pace:
            self._pause.started(now)

    # -- outcomes ------------------------------------------------------------------------------

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
        if rate_limited:
            self._on_429(started_at, retry_after, now)
        if headers is not None:
            self._read(headers, started_at, now)
        if not rate_limited and answered:
            self._evidence.answered_at(started_at, now)
            self._pause.clean_answer()
            self._climb(now, started_at)
        if self.room_left(now):
            self.in_flight._wake()  # room to use at once: waiters for a slot in flight may go

    def _read(self, statement: Statement, started_at: float, now: float) -> None:
        """What the service's headers state: a limit below ours lowers the ceiling (said once); and,
        while its statements are trusted, the room left, or a pause when none is left."""
        stated = statement.per_minute
        if self.auto is not None:
            if stated is not None and self._room.trusted and self.auto.stated(stated, now):
                self._follow_limit(now, f"the service's rate-limit headers state {stated:g}/min")
        elif stated is not None and stated < self.ceiling:
            self.ceiling = max(MIN_RPM, stated)
            if self.pace > self.ceiling or not self.pace:
                self._set_pace(self.ceiling, f"the service's rate-limit headers state {stated:g}/min", now)
        if not self._room.trusted:
            return
        if statement.remaining == 0 and statement.reset is not None and statement.reset > 0:
            reset = statement.reset
            self._hold(now + reset, f"the service's rate-limit headers say none left until the reset in {reset:g} s")
        if self.pace and self._room.note(statement, started_at, now, self._evidence.starts, self.in_flight.wire()):
            if self._wake is not None:
                self._wake.set()  # a turn waiting for the reset may go now

    def _on_429(self, started_at: float, retry_after: float | None, now: float) -> None:
        on_room = started_at in self._room_starts
        if self._room.refused(now):
            # The service refused while stating room: its statements are not believed again, in
            # this run and (the key's record) in the next.
            self._note("the service refused while its headers stated room left; its room is not used again", now)
            if self._record is not None:
                self._record.room_contradicted()
            if self.auto is not None and self.auto.distrusted(now):
                self._follow_limit(now, "the limit its headers stated is searched for again")
        self.rate_limited += 1
        self._log.refused(now)
        self._owed.refused += 1
        new_episode = started_at >= self._pause.until  # else it was sent before the pause in force
        stretch = self._evidence.refused_at(started_at, now, self.pace)
        wait, why = self._pause.after_429(retry_after, new_episode)
        self._hold(now + wait, why)
        # A 429 for a start on stated room says the room was not there, not that the pace is too high.
        if on_room or not self.pace:
            return
        if self.auto is not None:
            level, admitted = self._pace_at(started_at), self._evidence.admitted_surely(started_at)
            stretched = bool(stretch) and new_episode
            if self.auto.refused(started_at, level, now, stretched, admitted, self._admitted_since(now)):
                self._follow_limit(
                    now, f"the service refused at {level:.0f}/min after admitting {admitted} in a minute"
                )
        elif new_episode and stretch is not None:
            lowered = self._evidence.lowered_pace(started_at, stretch, self.pace)
            if lowered is not None:
                self._set_pace(*lowered, now)

    def _hold(self, until: float, reason: str, *, publish: bool = True) -> None:
        """Pause every sender until ``until`` (shared through the budget unless it came from there)."""
        now = self._clock()
        if self._pause.hold(until, reason, ramp=bool(self.pace)):
            self._log.paused(now, until, reason)
            self._owed.pause = self._owed.pause or publish
            if publish and self._wake is not None:
                self._wake.set()
        self._evidence.paused()

    def _climb(self, now: float, started_at: float) -> None:
        """Additive increase toward the ceiling while answers come back clean (under auto, the
        search's next step; the answer's start tells how long the level held)."""
        if self.auto is not None:
            quiet = self._evidence.unpaused_since
            if quiet is not None:
                quiet = max(quiet, self._pause.steady_since)  # a level holds once the ramp is done
            if quiet is not None and self.auto.clean(now, quiet, self._evidence.admitted_surely(now), started_at):
                self._follow_limit(now, "answers came back clean")
            return
        pace = self._evidence.climbed_pace(now, self._pause.until, self.pace, self.rpm, self.ceiling)
        if pace is not None:
            self._set_pace(pace, "answers came back clean" if pace >= self.ceiling else None, now)

    def _follow_limit(self, now: float, why: str) -> None:
        """Under auto: the limit in force or the level tried moved; the pace follows, and a limit
        found (or stated) goes to the key's record."""
        assert self.auto is not None
        self.ceiling = self.auto.limit()
        found, self.auto.found = self.auto.found, None
        if found is not None and self._record is not None:
            self._record.limit_found(found)
        reason = f"limit {self.auto.describe()}: {why}" if found is not None else None
        self._set_pace(self.auto.pace(), reason, now)

    def _pace_at(self, when: float) -> float:
        """The pace that was in force at ``when`` (of the last two minutes)."""
        for since, pace in reversed(self._paces):
            if since <= when:
                return pace
        return self._paces[0][1]

    def _admitted_since(self, now: float) -> float | None:
        """Under auto, what the service admitted a minute since the last contradicting refusal
        (None: none, or too long ago to count)."""
        assert self.auto is not None
        since = self.auto.contradicted_at
        starts = self._evidence.starts
        if since is None or not starts or since < starts[0] or now - since < 1.0:
            return None
        admitted = count_between(self._evidence.answered, since, now)
        return admitted * WINDOW / (now - since)

    def _set_pace(self, pace: float, reason: str | None, now: float, *, publish: bool = True) -> None:
        """Change the pace; a ``reason`` makes it a reported change (climbing steps are not)."""
        if pace == self.pace:
            return
        previous, self.pace = self.pace, pace
        self._paces.append((now, pace))
        while len(self._paces) > 1 and self._paces[1][0] < now - 2 * WINDOW:
            self._paces.popleft()
        self._log.pace_changed(now, pace)
        if publish:  # a lowering is told as such even when a climb follows before the next report
            self._owed.pace = "lowered" if pace < previous or self._owed.pace == "lowered" else "climbed"
        if reason is not None:
            self._changed(PaceChange(now, pace, previous, reason))

    def _note(self, reason: str, now: float) -> None:
        """A decision said once, with the pace as it is (the room's distrust)."""
        self._changed(PaceChange(now, self.pace, self.pace, reason))

    def _changed(self, change: PaceChange) -> None:
        self.changes.append(change)
        if self._on_pace_change is not None:
            self._on_pace_change(change)

    # -- what a progress line shows ------------------------------------------------------------

    def state(self) -> PacerState:
        now = self._clock()
        paused_for, reason = self._pause.left(now), self._pause.reason
        if (wait := self._room.reset_wait(now)) > paused_for:
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
        )
