"""The pace of a batch: when each attempt may start (``Pacer``) and how many may be on the wire
(``InFlight``). Every attempt, retries included, goes through both.

Spacing. Starts follow a schedule at the pace in force, 1% under it to absorb arrival jitter, kept
by the key's rate budget (``budget.py``: this process, every process on the machine, or every machine
through Redis): each start is due one interval after the one before was due, not after the event
loop got to it, so scheduling delays do not add up (a bucket of one alone, as aiolimiter's, drops
every delay; the difference is small, see benchmarks/README.md, but it only ever goes one way).
The 429 pause, the pace in force and the key's counts of the last minute travel through the budget
too, so every process sharing it pauses and slows together. Under the schedule lies a floor,
``aiolimiter.AsyncLimiter(1, 60/rpm)`` with half the margin: no two starts are ever closer than the
plan's own spacing, so no burst at the start or after a pause, and in any w seconds at most
ceil(rpm*w/60)+1 starts. A user may pass a limiter of their own as the floor (anything with
``async acquire()``, e.g. one ``AsyncLimiter`` shared by several batches in one process).

Two exceptions, each passing our own floor (never a user's). The first minute's catch-up: the
engine's first request goes alone, and the slots the pace had for its answer's latency go unused;
within the run's first minute, starts go up to ``MAX_CATCH_UP`` (1.5) times the pace, evenly spaced,
until they are back on the even pace from the first start, never ahead of it (so the first minute
holds at most the pace's count: a per-minute window opened by the first request, or a full token
bucket, admits it all). A 429 for an attempt it started lowers nothing and ends it; it is only for a
run alone on its budget (no other user's starts in the last minute, no reservation later than our
own schedule), and a share scales it. Stated room: after an answer whose headers state the room left
(remaining and reset), that many starts, less ours the service may not have counted yet (those since
a little before the stating request's start, and ours on the wire from before it), go at once,
within the in-flight cap; when it is used up nothing starts before the reset. Only for a run alone
on its budget with a share of 1 (two runs would spend one statement twice). Neither is for a run
that is one of several of one job (``alone=False``: Dask partitions, Spark tasks).

Pause. A 429 pauses every sender until its Retry-After (a jittered backoff when the value is absent
or unusable); the restart is gentle: spacing starts doubled and shrinks back (the ramp).

AIMD. The pace is lowered only on evidence that it is too high: a 429 for an attempt that started
after a stretch of unpaused sending at the pace (10 s of it), when the service had admitted less than
a minute at the pace in the minute before. It is then set just under what the service admitted in
that minute (never below half of what it was). 429s right after a pause
are what the pause and ramp explain, or a storm that refuses whatever we send: they lower nothing. While answers come back clean the pace climbs back to ``rpm`` additively: in 30 s
from far below; near a limit the service showed, by a tenth of ``rpm`` a minute up to it and a
hundredth above it (the limit is forgotten once clean
answers show the service admitting more than it in a minute, or when it refuses right after a
pause, whatever the pace: a storm, not a limit). Standard rate-limit headers set a ceiling (a stated limit)
or pause before a 429 (nothing remaining until the reset).

In flight. Little's law: rate x latency. The latency is the larger of the recent answers' longest
and the age of the oldest attempt still on the wire (so the limit grows before any answer is back),
with headroom; within a small start and a cap; during the catch-up at its rate, and with stated
room, up to what is on the wire plus the room. A retry waits at the front of the queue.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from aiolimiter import AsyncLimiter

from ._retry import MAX_RETRY_AFTER, RateLimitHeaders, backoff
from .budget import Budget, ProcessBudget, Report, Share, Slot
from .options import check_rpm
from .report import Timeline

__all__ = [
    "Pacer",
    "InFlight",
    "Limiter",
    "PaceChange",
    "PacerState",
    "JITTER_MARGIN",
    "DEFAULT_MAX_IN_FLIGHT",
    "UNPACED_IN_FLIGHT",
    "max_starts",
    "check_rpm",
]

JITTER_MARGIN = 0.01  # pace 1% under the limit: arrival times wobble by milliseconds
RAMP_START = 2.0  # after a pause, the first starts are this many intervals apart ...
RAMP_DECAY = 0.85  # ... and each start brings the spacing this much closer to normal
UNDER_LIMIT = 0.98  # on evidence, the pace drops to this share of what the service admitted in a minute ...
MAX_DECREASE = 0.5  # ... but to no less than this share of what it was
FULL_MINUTE = 0.97  # a minute that admitted this share of the pace shows the pace is not too high
EVIDENCE_SECONDS = 10.0  # a 429 is evidence only after this long of unpaused sending at the pace ...
EVIDENCE_STARTS = 10  # ... and at least this many starts
RECOVER_SECONDS = 30.0  # far from any limit the service showed, the pace climbs from 0 to rpm in 30 s
APPROACH_SECONDS = 600.0  # just under one, by rpm/600 a second (a tenth of rpm a minute) ...
PROBE_SECONDS = 6000.0  # ... and above it, probing whether the limit rose, by a hundredth a minute
FORGET_SHARE = 1.05  # a minute that admitted this share of a shown limit proves it wrong
WINDOW = 60.0  # the plan's limit is per minute
MIN_RPM = 1.0
MAX_CATCH_UP = 1.5  # the first minute's catch-up starts at most this many times as fast as the pace
ROOM_SLACK = 0.25  # our starts this long before a stating request may have reached the service after it
ALONE_AFTER = WINDOW  # another user of the budget seen this recently: no catch-up, no stated room

DEFAULT_MAX_IN_FLIGHT = 512  # the safety ceiling of automatic in-flight sizing
UNPACED_IN_FLIGHT = 16  # without a pace there is no rate to size from
START_IN_FLIGHT = 8  # before any latency is known
HEADROOM = 1.5  # in flight = rate x latency x headroom + SPARE
SPARE = 4
LATENCY_SAMPLES = 50


def max_starts(rpm: float, window: float) -> int:
    """The most starts the pacer allows in any ``window`` seconds at ``rpm``: ceil(rpm*w/60)+1."""
    return math.ceil(rpm * window / 60) + 1


class Limiter(Protocol):
    """Anything that spaces starts: ``await acquire()`` returns when one may start."""

    async def acquire(self) -> object: ...


@dataclass(frozen=True)
class PaceChange:
    """A change of the pace in force, reported once with its reason."""

    at: float
    pace: float
    previous: float
    reason: str

    def __str__(self) -> str:
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

    def describe(self) -> str:
        parts = []
        if self.paused_for > 0:
            parts.append(f"waiting {math.ceil(self.paused_for)} s: {self.pause_reason}")
        parts.append(f"pace {self.pace:.0f}/min" if self.pace else "no pacing")
        parts.append(f"in flight {self.in_flight}")
        return " · ".join(parts)


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


class _Owed:
    """What a pacer owes its budget, told with its next reservation (its own pause, the pace it set,
    the starts and 429s since), and what it last saw there (to tell others' news from its own)."""

    __slots__ = ("pause", "pace", "started", "refused", "seen", "pace_version", "pause_mark")

    def __init__(self) -> None:
        self.pause = False  # our own pause, not yet told
        self.pace: str | None = None  # our own pace, not yet told: "lowered" (always applies) or "climbed"
        self.started = 0
        self.refused = 0
        self.seen: Slot | None = None  # the budget's state at the last reservation
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


class _Evidence:
    """What the service has shown of its limit, and what AIMD concludes from it: this process's
    starts and 429s of the last two minutes, how long it has been sending unpaused, and the limit
    the service showed (what it admitted in a minute when it refused more). With a shared budget,
    the key's counts (as of the last reservation) stand in for this process's share of them."""

    __slots__ = ("starts", "refused", "unpaused_since", "shown_limit", "last_climb", "_shared", "_owed")

    def __init__(self, shared: bool, owed: _Owed) -> None:
        self.starts: list[float] = []  # start times of the last two minutes or so, in order
        self.refused: list[float] = []  # start times of attempts answered 429, same span, sorted
        self.unpaused_since: float | None = None
        self.shown_limit: float | None = None
        self.last_climb = -math.inf
        self._shared = shared
        self._owed = owed

    def started(self, now: float) -> None:
        if self.unpaused_since is None:
            self.unpaused_since = now
        self.starts.append(now)
        if self.starts[0] < now - 3 * WINDOW:  # forget what is older than two minutes, now and then
            del self.starts[: bisect.bisect_left(self.starts, now - 2 * WINDOW)]

    def refused_at(self, started_at: float, now: float, pace: float) -> bool | None:
        """Note a 429 for the attempt that started at ``started_at``; whether it came after a stretch
        of unpaused sending at ``pace`` (``stretch_before``)."""
        bisect.insort(self.refused, started_at)
        del self.refused[: bisect.bisect_left(self.refused, now - 2 * WINDOW)]
        return self.stretch_before(started_at, pace)

    def stretch_before(self, started_at: float, pace: float) -> bool | None:
        """Had we been sending unpaused at the pace for long enough (``EVIDENCE_SECONDS``) before
        ``started_at``? None: it was sent before the last pause ended."""
        since = self.unpaused_since
        if since is None or started_at < since:
            return None
        if self._shared:  # our starts are only our share of the key's: judge by time
            return started_at - since >= EVIDENCE_SECONDS
        sent = _count(self.starts, since, started_at)
        return sent >= max(EVIDENCE_STARTS, pace * EVIDENCE_SECONDS / WINDOW)

    def admitted(self, before: float) -> int:
        """Starts in the minute before ``before`` that were not answered 429: this process's, or
        with a shared budget the key's as a whole (as of the last reservation)."""
        seen = self._owed.seen
        if self._shared and seen is not None:
            return max(0, seen.starts - seen.refused)
        since = before - WINDOW
        return max(0, _count(self.starts, since, before) - _count(self.refused, since, before))

    def lowered_pace(self, started_at: float, stretch: bool, pace: float) -> tuple[float, str] | None:
        """The pace a new 429 episode calls for, and why; None when it is no evidence of a limit."""
        if not stretch:
            # Refused right after a pause, before the pace could matter: the service is refusing
            # whatever we send (a storm). It lowers nothing, and what the service admitted before
            # says nothing about a limit.
            self.shown_limit = None
            return None
        admitted = self.admitted(started_at)
        if admitted >= FULL_MINUTE * pace / (1 + JITTER_MARGIN):
            return None  # it took a whole minute at the pace before refusing: the pace is not too high
        # Refused after a stretch of sending at the pace, having admitted less than a minute of it:
        # the limit is about what it admitted. Never more than halve the pace on one episode.
        self.shown_limit = max(MIN_RPM, float(admitted))
        lowered = max(MIN_RPM, math.floor(max(pace * MAX_DECREASE, min(pace, admitted) * UNDER_LIMIT)))
        return lowered, f"the service refused after admitting {admitted} requests in a minute at {pace:.0f}/min"

    def climbed_pace(self, now: float, paused_until: float, pace: float, rpm: float, ceiling: float) -> float | None:
        """The pace after the clean answer at ``now``: additively up toward ``ceiling`` (fast far from
        any limit the service showed, slowly near it, and probing above it); None for no change."""
        since = max(self.last_climb, paused_until)
        self.last_climb = now
        if not pace or pace >= ceiling or since == -math.inf or now <= since:
            return None
        shown = self.shown_limit
        if shown is not None and self.admitted(now) >= FORGET_SHARE * shown:
            self.shown_limit = shown = None  # the service admitted more in a minute: the limit is higher
        if shown is None or pace < 0.9 * shown:
            seconds = RECOVER_SECONDS
        else:
            seconds = APPROACH_SECONDS if pace < shown else PROBE_SECONDS
        return min(ceiling, pace + rpm * (now - since) / seconds)


def _count(times: list[float], since: float, before: float) -> int:
    """How many of the sorted ``times`` lie in [since, before)."""
    return bisect.bisect_left(times, before) - bisect.bisect_left(times, since)


class _FirstMinute:
    """The run's first minute and its catch-up, and whether the run is alone on its budget. The
    catch-up is undecided until the run's first reservation (on only for a run alone, with no limiter
    of the user's); then on until the minute ends or anything (a pause, a 429, another user of the
    budget) ends it. ``fraction``: the run's share of the key's rate (1 without a share)."""

    __slots__ = ("start", "starts", "catch_up", "span", "next_due", "others_at", "_shared", "_fraction")

    def __init__(self, possible: bool, shared: bool, fraction: float) -> None:
        self.start: float | None = None  # the run's first start: its first minute is [this, this + 60)
        self.starts = 0  # starts in the run's first minute
        self.catch_up: bool | None = None if possible else False
        self.span: tuple[float, float] | None = None  # (first quick start, end) of the catch-up
        self.next_due = -math.inf  # when our schedule puts the next start (our clock), if we are alone
        self.others_at = -math.inf  # when the budget last showed another user's starts
        self._shared = shared
        self._fraction = fraction

    def started(self, now: float, quick: bool) -> bool:
        """Note a start (``quick``: faster than the pace); whether it is the run's first."""
        if quick and self.catch_up and self.span is None:
            self.span = (now, math.inf)  # the catch-up's first start faster than the pace
        first = self.start is None
        if self.start is None:
            self.start = now
        if now < self.start + WINDOW:
            self.starts += 1
        return first

    def spacing(self, now: float, normal: float) -> tuple[float, bool]:
        """The interval to reserve with (``normal``: the key's at the pace) and whether it is faster
        than the pace. The lone first request left the pace's slots unused while it was on the wire;
        within the run's first minute, starts go up to ``MAX_CATCH_UP`` times the pace, evenly spaced,
        until they are back on the even pace from the first start, and never ahead of it: the first
        minute holds no more than the pace's count of starts."""
        first = self.start
        if not self.catch_up or first is None:
            return normal, False
        own = normal / self._fraction  # this run's own spacing at the pace
        at = max(now, self.next_due)
        following = first + (self.starts + 1) * own  # when the even pace from the first start puts the next
        if following >= first + WINDOW or not self.alone(now):
            self.end(now)
            return normal, False
        spacing = min(own, max(own / MAX_CATCH_UP, following - at))
        return spacing * self._fraction, spacing < own * (1 - 1e-9)

    def reserved(self, due: float, interval: float, before: float) -> None:
        """Our own start was reserved; the next is due ``interval`` (the key's) after ``due``. The
        run's first reservation decides the catch-up."""
        self.next_due = due + interval / self._fraction
        if self.catch_up is None:
            self.catch_up = self.alone(before)

    def look_for_others(self, slot: Slot, before: float, start: bool, starts: list[float], paused_until: float) -> None:
        """Note when the budget shows another user: starts of the last minute that are not ours (of
        our own ``starts``), or a reserved start later than our own schedule puts it."""
        if not self._shared:
            return
        ours = len(starts) - bisect.bisect_left(starts, before - WINDOW - 1)  # at least what it counted of ours
        later = start and not slot.deferred  # our own turn had come: a later slot is someone else's
        due = max(before, self.next_due, paused_until)
        if slot.starts > ours or (later and before + slot.wait > due + 0.002):
            self.others_at = before
            self.end(before)

    def alone(self, now: float) -> bool:
        """No other user of the budget seen in the last minute (a private budget: always)."""
        return not self._shared or now - self.others_at > ALONE_AFTER

    def behind(self, interval: float, now: float) -> bool:
        """Is the catch-up behind the even pace from the first start (``interval``: the key's)?"""
        first = self.start
        return bool(self.catch_up) and first is not None and first + self.starts * (interval / self._fraction) < now

    def end(self, now: float) -> None:
        if self.catch_up and self.span is not None:
            self.span = (self.span[0], now)
        self.catch_up = False

    def during(self, started_at: float) -> bool:
        """Did the attempt that started at ``started_at`` start while the catch-up went faster than
        the pace (from its first quick start to its end)?"""
        span = self.span
        return span is not None and span[0] <= started_at < span[1]


class _StatedRoom:
    """Room the service's headers last stated: ``count`` more starts before ``until`` (our clock: the
    stating attempt's start plus the reset, the earliest the window can have moved); when it is used
    up, nothing starts before ``reset_at`` (the answer's arrival plus the reset, the latest)."""

    __slots__ = ("count", "until", "reset_at")

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """No room stated (or none trusted any more)."""
        self.count = 0
        self.until = -math.inf
        self.reset_at = -math.inf

    def note(
        self, headers: RateLimitHeaders, started_at: float, now: float, starts: list[float], wire: Iterable[float]
    ) -> bool:
        """The room the headers of the attempt that started at ``started_at`` state: ``remaining``
        until ``reset``, less what of ours the service may not have counted yet (of our ``starts``,
        those since a little before that attempt's, and what of ours was on the wire from before it,
        started at ``wire``). Each such figure is at most the room there is; the largest one still
        valid is kept (answers to requests sent together arrive in any order, and the one that
        counted the most of them leaves the most room once they are taken off). Whether it is newly
        kept with room left (a turn waiting for the reset may go now)."""
        if headers.remaining is None or headers.reset is None:
            return False
        since = started_at - ROOM_SLACK
        later = len(starts) - bisect.bisect_left(starts, since) - 1  # less the stating attempt itself
        on_wire = sum(1 for t in wire if t < since)
        left = headers.remaining - max(0, later) - on_wire
        if now < self.until and self.count >= left:
            return False
        self.count, self.until = left, started_at + headers.reset
        self.reset_at = now + min(headers.reset, MAX_RETRY_AFTER)
        return left > 0

    def left(self, now: float) -> int:
        """Starts still stated before the reset (0: none stated, used up or expired)."""
        return self.count if self.count > 0 and now < self.until else 0

    def used(self, now: float) -> None:
        if now < self.until:
            self.count -= 1

    def reset_wait(self, now: float) -> float:
        """How long nothing more starts: until the reset, once the room is used up (0: it is not, or
        the reset is past). A newer statement of room ends the wait (our count is conservative)."""
        return max(0.0, self.reset_at - now) if self.count <= 0 else 0.0


class Pacer:
    """Shared by every sender of a batch: ``start = await before_attempt()`` before each attempt,
    ``after_attempt(start, ...)`` after it. ``rpm=0``: no pacing, but 429 pauses are still shared.

    ``limiter``: your own floor (``async acquire()``) instead of ``AsyncLimiter(1, 60/rpm)``; the
    schedule at the pace, the pause, the ramp and the lowered pace still apply. ``budget``: the key's
    rate budget the schedule, pause and pace are shared through (default: a private one in this
    process). ``on_pace_change`` is told of each ``PaceChange``. ``share``: this run may use only that
    fraction of the key's rate (``budget.Share``), on whatever budget.
    """

    __slots__ = (
        "rpm",
        "pace",
        "ceiling",
        "rate_limited",
        "changes",
        "_clock",
        "_wake",
        "_limiter",
        "_budget",
        "_owed",
        "_turn",
        "_paused_until",
        "_pause_reason",
        "_ramp",
        "_episodes",
        "_evidence",
        "_on_pace_change",
        "_share",
        "in_flight",
        "timeline",
        "_own_floor",
        "_first_minute",
        "_alone",
        "_room",
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
    ) -> None:
        self.rpm = check_rpm(rpm)
        # False: one of several runs of one job at once (Dask partitions, Spark tasks), which start
        # together on one budget: none catches up or spends stated room (each would take it as its own).
        self._alone = alone
        self.pace = float(rpm)  # the pace in force
        self.ceiling = float(rpm)  # rpm, or lower when the service's headers state a lower limit
        self.rate_limited = 0  # 429s seen
        self.changes: list[PaceChange] = []
        self._clock = clock
        self._wake: asyncio.Event | None = None  # set when our own 429 pauses us: a sleeping turn rechecks
        self._own_floor = limiter is None and bool(
            self.rpm
        )  # the floor below is ours: the catch-up and stated room pass it
        if limiter is None and self.rpm:
            # The floor: never two starts closer than the plan's own spacing (with half the margin).
            limiter = AsyncLimiter(1, 60.0 / self.rpm * (1 + JITTER_MARGIN / 2))
        self._limiter = limiter
        self._budget = budget if budget is not None else ProcessBudget(clock)
        self._owed = _Owed()
        self._turn: asyncio.Lock | None = None
        self._paused_until = -math.inf
        self._pause_reason: str | None = None
        self._ramp = 1.0
        self._episodes = 0  # 429 episodes since the last clean answer (the backoff's exponent)
        self._evidence = _Evidence(self._budget.shared, self._owed)
        self._on_pace_change = on_pace_change
        self._share = share if share is not None and share.fraction < 1 else None
        self.in_flight = InFlight(self, max_in_flight)
        self.timeline = Timeline(self.rpm)
        fraction = 1.0 if self._share is None else self._share.fraction
        self._first_minute = _FirstMinute(bool(self.rpm and self._own_floor and alone), self._budget.shared, fraction)
        self._room = _StatedRoom()

    # -- spacing -------------------------------------------------------------------------------

    @property
    def interval(self) -> float:
        """Seconds between starts at the pace in force (0 without pacing)."""
        return 60.0 / self.pace * (1 + JITTER_MARGIN) if self.pace else 0.0

    async def before_attempt(self) -> float:
        """Wait for this attempt's turn; returns the time it starts (pass it to ``after_attempt``)."""
        if self._turn is None:
            self._turn = asyncio.Lock()
        async with self._turn:  # one caller at a time takes a turn: FIFO order, one reservation
            while True:
                while (wait := self._room.reset_wait(self._clock())) > 0:
                    await self._nap(min(wait, 1.0))  # used up: wait for the reset, or a newer statement
                slot, quick = await self._reserve()
                # Within a microsecond is on time: a float sum can land an ulp short, and a sleep
                # of an ulp does not move the clock.
                if slot.wait > 1e-6:
                    await self._nap(slot.wait)
                    if slot.deferred:
                        continue  # this run's share: its own turn has come, now take the key's next slot
                    if self._budget.shared and not self._paused():
                        await self._reserve(start=False)  # did another process get a 429 meanwhile?
                if self._limiter is not None and not (quick and self._own_floor):
                    await self._limiter.acquire()  # the catch-up and stated room pass our own floor, not yours
                if not self._paused():
                    break  # else a 429 arrived while we waited: reserve again, sharing its pause
        now = self._clock()
        if self._started(now, quick) and self._budget.shared and self._alone and self._own_floor:
            # Tell the budget of the run's first start at once, not with the next reservation (after
            # the first answer): a run starting beside this one sees it, and neither catches up. (Not
            # for one of several runs of a job: none of them catches up, and the report would hold
            # its first request back from the slot the budget gave it.)
            await self._reserve(start=False)
        return now

    def _paused(self) -> bool:
        return self._clock() < self._paused_until - 1e-6

    async def _nap(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when a 429 pauses us meanwhile (to share the pause at once)."""
        self._wake = wake = asyncio.Event()
        try:
            await asyncio.wait_for(wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        finally:
            self._wake = None

    async def _reserve(self, *, start: bool = True) -> tuple[Slot, bool]:
        """Reserve the next start on the budget, telling it what it must share; adopt what others
        told it. The schedule is drift-free: a start is due an interval after the one before was
        due; after an idle spell or a pause it starts afresh from now. Also whether the reservation
        goes faster than the pace (the first minute's catch-up, or room the service stated)."""
        before = self._clock()
        pause_for = max(0.0, self._paused_until - before)
        report = self._owed.take(pause_for, self._pause_reason, self.pace if self.rpm else None)
        interval, quick = self._spacing(before) if start else (self.interval * self._ramp, False)
        if self._share is None:
            slot = await self._budget.reserve(interval, report, start=start)
        else:
            slot = await self._budget.reserve(interval, report, start=start, share=self._share)
        self._first_minute.look_for_others(slot, before, start, self._evidence.starts, self._paused_until)
        if start and not slot.deferred:
            # When our next start is due, if we are alone on the budget (a late estimate: the
            # budget's clock read the time somewhere between before and now).
            self._first_minute.reserved(self._clock() + slot.wait, interval, before)
        self._adopt(slot, report)
        return slot, quick

    def _spacing(self, now: float) -> tuple[float, bool]:
        """The interval to reserve with (the key's spacing after this start), and whether it is
        faster than the pace: room the service stated (no spacing), or the first minute's catch-up;
        else the pace in force (with the ramp after a pause)."""
        normal = self.interval * self._ramp
        if not self.pace or self._paused():
            return normal, False
        if self.room_left(now) > 0:
            return 0.0, True
        return self._first_minute.spacing(now, normal)

    def room_left(self, now: float) -> int:
        """Starts the service's headers still allow before their reset, beyond the pace (0: none
        stated, used up, expired, or not ours to use: another user on the budget, a share)."""
        if self._share is not None or not self._alone or not self._first_minute.alone(now):
            return 0
        return self._room.left(now)

    @property
    def rate(self) -> float:
        """Starts per second at the pace in force, or faster while the first minute's catch-up is
        behind the even pace from the first start."""
        rate = self.pace / WINDOW
        if rate and self._first_minute.behind(self.interval, self._clock()):
            rate *= MAX_CATCH_UP
        return rate

    async def flush(self) -> None:
        """Tell the budget what it has not heard yet (the last starts, a pause, a pace): at the end
        of a batch, so that others' counts are whole."""
        if self._owed:
            await self._reserve(start=False)

    def _adopt(self, slot: Slot, report: Report) -> None:
        """Take on a pause or a pace another user of the budget set."""
        now = self._clock()
        owed = self._owed
        owed.seen = slot
        if slot.paused_for > 0 and slot.pause_mark != owed.pause_mark:
            owed.pause_mark = slot.pause_mark
            if not report.pause_for:  # someone else's pause
                self._pause(
                    now + slot.paused_for,
                    slot.pause_reason or "another process sharing the budget got a 429",
                    publish=False,
                )
        if self.rpm and slot.pace is not None and slot.pace_version != owed.pace_version:
            owed.pace_version = slot.pace_version
            pace = max(MIN_RPM, min(self.ceiling, slot.pace))
            if slot.pace != report.pace and abs(pace - self.pace) >= 0.5:  # someone else's pace
                if pace < self.pace:  # lowered on their evidence of a limit about where it now is
                    self._evidence.shown_limit = pace / UNDER_LIMIT
                    self._set_pace(pace, "another process sharing the rate budget lowered it", now, publish=False)
                else:
                    self._set_pace(pace, None, now, publish=False)
                self._evidence.last_climb = now  # climb from here, not again over what they climbed

    def now(self) -> float:
        return self._clock()

    def _started(self, now: float, quick: bool) -> bool:
        """Note a start (``quick``: faster than the pace); whether it is the run's first."""
        first = self._first_minute.started(now, quick)
        self._room.used(now)
        self.timeline.started(now)
        self._owed.started += 1
        self._evidence.started(now)
        if self.pace:
            self._ramp = max(1.0, self._ramp * RAMP_DECAY)
        return first

    # -- outcomes ------------------------------------------------------------------------------

    def after_attempt(
        self,
        started_at: float,
        *,
        rate_limited: bool = False,
        retry_after: float | None = None,
        answered: bool = True,
        headers: RateLimitHeaders | None = None,
    ) -> None:
        """The attempt that started at ``started_at`` ended: answered 429 (``rate_limited``, with the
        service's ``retry_after``), answered otherwise, or not answered at all (``answered=False``:
        cancelled, timed out, connection lost)."""
        now = self._clock()
        if headers is not None:
            self._obey_headers(headers, now)
            wire = self.in_flight._wire.values()
            if self.pace and self._room.note(headers, started_at, now, self._evidence.starts, wire) and self._wake:
                self._wake.set()  # a turn waiting for the reset may go now
        if rate_limited:
            self._on_429(started_at, retry_after, now)
        elif answered:
            self._episodes = 0
            self._climb(now)
        if self.room_left(now):
            self.in_flight._wake()  # room to use at once: waiters for a slot in flight may go

    def _pause(self, until: float, reason: str, *, publish: bool = True) -> None:
        if until > self._paused_until:
            self.timeline.paused(self._clock(), until, reason)
            self._paused_until = until
            self._pause_reason = reason
            self._owed.pause = self._owed.pause or publish
            if publish and self._wake is not None:
                self._wake.set()
        self._evidence.unpaused_since = None
        self._first_minute.end(self._clock())
        if self.pace:
            self._ramp = RAMP_START

    def _on_429(self, started_at: float, retry_after: float | None, now: float) -> None:
        # Sent during the first minute's catch-up: the service refused slots the pace had left unused
        # (a sliding window, a small bucket), which says nothing of the pace. The catch-up ends (the
        # pause ends it) and the pace stays; any room stated before is no longer trusted.
        catching_up = self._first_minute.during(started_at)
        self._room.forget()
        self.rate_limited += 1
        self.timeline.refused(now)
        self._owed.refused += 1
        new_episode = started_at >= self._paused_until  # else it was sent before the pause in force
        stretch = self._evidence.refused_at(started_at, now, self.pace)
        if new_episode:
            self._episodes += 1
        if retry_after is not None:
            wait, why = retry_after, f"the service answered 429 (Retry-After {retry_after:g})"
        else:
            wait = backoff(min(self._episodes, 8))
            why = "the service answered 429 without a usable Retry-After; backing off"
        self._pause(now + min(wait, MAX_RETRY_AFTER), why)
        if new_episode and stretch is not None and self.pace and not catching_up:
            lowered = self._evidence.lowered_pace(started_at, stretch, self.pace)
            if lowered is not None:
                self._set_pace(*lowered, now)

    def _climb(self, now: float) -> None:
        """Additive increase toward the ceiling while answers come back clean."""
        pace = self._evidence.climbed_pace(now, self._paused_until, self.pace, self.rpm, self.ceiling)
        if pace is not None:
            self._set_pace(pace, "answers came back clean" if pace >= self.ceiling else None, now)

    def _obey_headers(self, headers: RateLimitHeaders, now: float) -> None:
        if headers.per_minute is not None and headers.per_minute < self.ceiling:
            self.ceiling = max(MIN_RPM, headers.per_minute)
            if self.pace > self.ceiling or not self.pace:
                self._set_pace(self.ceiling, f"the service's rate-limit headers state {headers.per_minute:g}/min", now)
        if headers.remaining == 0 and headers.reset is not None and headers.reset > 0:
            self._pause(
                now + min(headers.reset, MAX_RETRY_AFTER),
                f"the service's rate-limit headers say none left until the reset in {headers.reset:g} s",
            )

    def _set_pace(self, pace: float, reason: str | None, now: float, *, publish: bool = True) -> None:
        """Change the pace; a ``reason`` makes it a reported change (climbing steps are not)."""
        if pace == self.pace:
            return
        previous, self.pace = self.pace, pace
        self.timeline.pace_changed(now, pace)
        if publish:  # a lowering is told as such even when a climb follows before the next report
            self._owed.pace = "lowered" if pace < previous or self._owed.pace == "lowered" else "climbed"
        if reason is not None:
            change = PaceChange(now, pace, previous, reason)
            self.changes.append(change)
            if self._on_pace_change is not None:
                self._on_pace_change(change)

    # -- what a progress line shows ------------------------------------------------------------

    def state(self) -> PacerState:
        now = self._clock()
        paused_for, reason = max(0.0, self._paused_until - now), self._pause_reason
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
        )


class InFlight:
    """How many attempts may hold a slot (queued for their turn or on the wire): the pacer's rate x
    the latency (Little's law) x headroom, at least ``START_IN_FLIGHT``, at most ``cap``. FIFO, but
    a retry goes before first attempts (the rows after it wait in order behind it)."""

    __slots__ = ("cap", "held", "_pacer", "_wire", "_latencies", "_waiters", "_timer", "_tried")

    def __init__(self, pacer: Pacer, cap: int | None) -> None:
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
        if not self._waiters and self.held < self.limit(self._pacer._clock()):
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
            self._latencies.append(max(0.0, self._pacer._clock() - start))
        self.release()

    def _wake(self) -> None:
        now = self._pacer._clock()
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
