"""Starts reserved ahead on a far budget (``Budget.far``: Redis, a network away): a pacer reserves its
next few starts in one call (``AHEAD``), each an interval after the key's previous one, takes them
one by one at their time, and tells the budget afterwards which went out. No round trip stands
between a start's time and its going out, and the next reservation is made while these are spent.

Invariant: a start reserved ahead goes out at its time, at most ``late(interval)`` after it (half
an interval, or ``LATE_SECONDS`` when that is longer; any time without pacing), or not at all (its
slot is lost, never told as a start), unless ``STARVED`` starts in a row were lost so (its event loop
held: it goes late rather than never); never while a pause holds, after the budget came back empty,
or once the interval in force is wider than the one it was reserved at. Nothing is reserved while a
pause holds (those starts could not go, and each call would push the key's schedule out for every
run). So the starts of every process on the budget keep the spacing of their reservations, each late
by at most that while its process keeps time.

A start reserved ahead is never taken back: a live run (the gateway's) takes the key's next start not
yet reserved, one at a time, when a request waits for it. While a live lane is open on the key
(``Slot.live_open``), a batch run reserves each start just in time, its answer's way back and a few
milliseconds before it goes, and the budget defers one asked earlier while the lane has room
(``budgets/gcra.py``): the key's next start stays free for a live request until then.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from .budgets.exchange import AHEAD, LOOK, Slot
from .budgets.gcra import LIVE_SLACK
from .budgets.spacing import WINDOW
from .evidence import Evidence
from .pause import ON_TIME
from .turn import MINUTE_LOOK, AtTurn, Turn, TurnGiven

__all__ = [
    "FarTurn",
    "Held",
    "in_time",
    "batch_of",
    "Lateness",
    "offset",
    "late",
    "share_of",
    "answer_way",
    "LATE_SHARE",
    "LATE_SECONDS",
    "STARVED",
    "COVER",
    "MAX_BATCH",
]

# A start reserved ahead goes at most this late, else not at all: half an interval (the spacing at the
# service within one interval), or 50 ms when that is longer, so that a busy machine's wake-ups (a few
# ms to tens of them) cost no starts at high rates; 50 ms is under 1% of a 10 s window (docs/pacing.md).
LATE_SHARE = 0.5
LATE_SECONDS = 0.05
# A pacer whose event loop is held longer than that, again and again (a blocking call in the loop, a
# starved CPU), would lose every start: after this many lost in a row, its next late start goes late
# (the hold is the machine's send delay, docs/pacing.md), so that it keeps moving.
STARVED = 3
COVER = 2.0  # a pacer holds enough starts to cover this many of the budget's round trips at its own pace
MAX_BATCH = 32  # starts reserved in one call, at most
SAMPLES = 16  # round trips (and at_turn's times) remembered
CLOSE_SECONDS = 2.0  # a reservation under way when the run ends is let finish this long
RETURN_MARGIN = 1.1  # a reservation's first start is asked this much later than its answer's way back


class Slotted(Protocol):
    """How many attempts may be in flight (``in_flight.InFlight``), and how many are."""

    @property
    def on_wire(self) -> int: ...

    def limit(self, now: float) -> int: ...


@dataclass(frozen=True, slots=True)
class Held:
    """A start reserved ahead: its time on our clock, the interval it was reserved at, whether on
    stated room, and the budget's epoch it was reserved on."""

    at: float
    interval: float
    on_room: bool
    epoch: str | None


@dataclass(slots=True)
class Lateness:
    """What became of the starts reserved ahead that did not go at their time: ``lost`` (never sent,
    never told), ``behind`` (sent late all the same), and how many in a row were lost to a held loop."""

    lost: int = 0
    behind: int = 0
    in_a_row: int = 0

    def dropped(self, held: Held, now: float, claimed: float | None) -> bool:
        """Whether ``held``, taken at ``now``, is too late to keep the spacing (then it is lost). One
        late because at_turn answered after its time (``claimed``: a slow claim) is lost; one late
        though its wait began in time is the loop held, and after ``STARVED`` such in a row it goes
        late rather than never (``behind``)."""
        due = held.at + late(held.interval) + ON_TIME
        if held.interval <= 0 or now <= due:
            self.in_a_row = 0
            return False
        if claimed is not None and claimed > due:  # the claim's doing, not the loop's: the next goes in time
            self.lost += 1
            return True
        if self.in_a_row < STARVED:
            self.in_a_row += 1
            self.lost += 1
            return True
        self.behind += 1  # the loop is held for longer than the spacing allows: go late, not never
        self.in_a_row = 0
        return False


@dataclass(eq=False, slots=True)
class FarTurn(Turn):
    """The schedule of starts on a far budget: starts held, the next reservation made in the background
    when they run low (``coming``), each taken at its time; ``lateness``: those that were not."""

    held: deque[Held] = field(default_factory=deque, init=False)
    coming: asyncio.Task[None] | None = field(default=None, init=False)
    telling: asyncio.Task[None] | None = field(default=None, init=False)  # a live run's start told
    failed: BaseException | None = field(default=None, init=False)
    rtts: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES), init=False)
    turn_took: deque[float] = field(default_factory=lambda: deque([0.0], maxlen=SAMPLES), init=False)
    offsets: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=SAMPLES), init=False)
    lateness: Lateness = field(default_factory=Lateness, init=False)
    queued: bool = field(default=True, init=False)  # the last reservation had others' starts ahead of it
    in_flight: Slotted | None = field(default=None, init=False)  # the pacer's: a batch no bigger than its room

    async def _take_turn(self, at_turn: AtTurn | None) -> tuple[float, bool]:
        claimed: float | None = None  # when at_turn answered (asked once, ahead by the time it takes)
        while True:
            held = await self._next()
            if at_turn is not None and claimed is None:
                await self._sleep_until(held.at - max(self.turn_took))
                if self._stale(held):
                    continue
                started = self.clock()
                go = await at_turn()
                claimed = self.clock()
                self.turn_took.append(claimed - started)
                if not go:  # its start stays at the head, for the next attempt
                    raise TurnGiven
            await self._sleep_until(max(held.at, self.last_start + held.interval))  # our own last start too
            if self._stale(held):
                continue
            self.held.popleft()
            if self.lateness.dropped(held, self.clock(), claimed):
                continue
            return held.interval, held.on_room

    def _started(self, now: float, interval: float, on_room: bool) -> None:
        self.sharing.owed.started.append(now)  # told to the budget with the next call
        Turn._started(self, now, interval, on_room)  # (a limiter's next: after it; a live run's: when asked)
        if self.coming is None and self.limiter is None and not self.live and self._low(now):
            self.coming = asyncio.ensure_future(self._reserve_ahead())
        elif self.live and self.telling is None:  # no reservation follows it soon: told now, for the ledger
            self.telling = asyncio.ensure_future(self._tell())

    async def _tell(self) -> None:
        """What this run owes its budget told now (a live run's start), off its requests' way."""
        with contextlib.suppress(Exception):  # if it fails, left owed: the next call tells it
            await self.sharing.exchange(LOOK, 0.0, self.last_start)
        self.telling = None

    async def _next(self) -> Held:
        """The next start held, reserving when none is (the reservation goes on if this is cancelled)."""
        while not self.held:
            if self.failed is not None:
                failed, self.failed = self.failed, None
                raise failed
            if self.coming is None:
                self.coming = asyncio.ensure_future(self._reserve_ahead())
            await asyncio.shield(self.coming)
        return self.held[0]

    async def _sleep_until(self, at: float) -> None:
        """Until ``at`` on our clock, or a pause of ours (the alarm)."""
        while (wait := at - self.clock()) > ON_TIME and not self.pause.paused(self.clock()):
            await self.alarm.nap(wait)

    def _stale(self, held: Held) -> bool:
        """Whether the starts held can no longer go (then they are dropped): a pause holds, the
        budget came back empty since, or the interval in force is wider than theirs."""
        now = self.clock()
        if not (self.pause.paused(now) or held.epoch != self.sharing.epoch or self._spacing(now)[0] > held.interval):
            return False
        self.lateness.lost += len(self.held)
        self.held.clear()
        return True

    def _low(self, now: float) -> bool:
        """What is held ends within ``COVER`` round trips, and is less than a call reserves."""
        if not self.held:
            return True
        interval = self.held[-1].interval
        return self.held[-1].at - now < COVER * self._rtt() and len(self.held) < batch_of(self, interval)

    def _rtt(self) -> float:
        return statistics.median(self.rtts) if self.rtts else 0.0

    async def _reserve_ahead(self) -> None:
        """The next starts reserved on the budget and held; a failure kept for the next taker."""
        try:
            while True:
                if (asked := in_time(self)) is not None:  # the key's next start left free for a live request
                    await self._sleep_until(asked)
                # Nothing is reserved while a pause holds: its starts could not go, and each call
                # reserving them again would push the key's schedule further out (every run's).
                while (wait := self.pause.left(self.clock())) > ON_TIME:
                    await self.alarm.nap(wait)
                while (wait := self.room.reset_wait(self.clock())) > ON_TIME:
                    await self.alarm.nap(min(wait, 1.0))
                while self._minute_full():
                    await self.alarm.nap(MINUTE_LOOK)
                    await self.sharing.exchange(LOOK, 0.0, self.last_start)
                if not self.rtts:  # the first: a look tells how far the budget is, so its starts are reachable
                    await self.sharing.exchange(LOOK, 0.0, self.last_start)
                    self.rtts.append(self.sharing.call[1] - self.sharing.call[0])
                interval, on_room = self._spacing(self.clock())
                way_back = answer_way(self.rtts)  # the first start no sooner than the answer reaches us
                lane = in_time(self) is not None  # a live lane open: one start at a time, just in time
                single = on_room or self.share is not None or self.limiter is not None or self.live > 0 or lane
                count = 1 if single else batch_of(self, interval)
                outages = self.sharing.budget.outage.ended
                slot = await self.sharing.exchange(
                    AHEAD, interval, self.last_start, ahead=count, lead=way_back, live=self.live
                )
                if slot.deferred:  # its share's own turn has not come; or a live lane's may (then: be there in time)
                    await self.alarm.nap(slot.wait - (min(self.rtts) if self.share is None else 0.0))
                    continue
                # A call that waited out an outage says nothing of the round trip.
                self._hold(slot, interval, on_room, count, way_back, timed=outages == self.sharing.budget.outage.ended)
                return
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the next taker raises it
            self.failed = exc
        finally:
            self.coming = None

    def _hold(self, slot: Slot, interval: float, on_room: bool, count: int, lead: float, timed: bool) -> None:
        """Hold the ``count`` starts ``slot`` reserved, on our clock (``offset``; ``timed``: the call's
        round trip is one to learn from); note whether others' starts were reserved ahead of them
        (``queued``: later than our own held ones and the ``lead`` allow)."""
        called, answered = self.sharing.call
        if timed or not self.offsets:
            self.rtts.append(answered - called)
        mapped = offset(self.offsets, slot, called, answered) if timed or not self.offsets else min(self.offsets)[1]
        first = slot.at - mapped if slot.at is not None else called + slot.wait
        earliest = max(called + min(self.rtts) / 2 + lead, self.held[-1].at + interval if self.held else -math.inf)
        self.queued = first > earliest + interval
        epoch = self.sharing.epoch
        self.held.extend(Held(first + i * interval, interval, on_room, epoch) for i in range(count))

    async def close(self) -> None:
        """The calls under way are let finish (their reports told), or cancelled after ``CLOSE_SECONDS``."""
        calls = {call for call in (self.coming, self.telling) if call is not None}
        self.coming = self.telling = None
        if calls:
            await asyncio.wait(calls, timeout=CLOSE_SECONDS)
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)


def batch_of(turn: FarTurn, interval: float) -> int:
    """Starts to reserve in one call: enough to cover ``COVER`` round trips, at the key's pace when
    nothing was queued ahead of the turn's last reservation (it is alone, or every run's starts are
    spent), else at its share of the key's starts (``share_of``); no more than can be in flight."""
    if interval <= 0:
        return MAX_BATCH  # no pacing: nothing to space, only a shared pause to hear
    share = 1.0 if not turn.queued else share_of(turn.evidence, turn.clock())
    wanted = math.ceil(COVER * turn._rtt() * share / interval)
    if turn.in_flight is not None:
        wanted = min(wanted, turn.in_flight.limit(turn.clock()) - turn.in_flight.on_wire)
    return max(1, min(MAX_BATCH, wanted))


def in_time(turn: FarTurn) -> float | None:
    """When a batch run asks for its next start while a live lane is open on its key (None: no lane, or
    a live run): just in time, its next start by its own schedule less the call's way there, its
    answer's way back and half the slack the budget allows it (``budgets/gcra.py``: the other half
    for the call's own delays)."""
    seen = turn.evidence.seen
    if turn.live or seen is None or not seen.live_open:
        return None
    last = turn.held[-1].at if turn.held else turn.last_start
    way = min(turn.rtts, default=0.0) / 2 + answer_way(turn.rtts) + LIVE_SLACK / 2
    return last + turn._spacing(turn.clock())[0] - way


def late(interval: float) -> float:
    """How late a start reserved ahead at ``interval`` may still go."""
    return max(LATE_SHARE * interval, LATE_SECONDS)


def offset(offsets: deque[tuple[float, float]], slot: Slot, called: float, answered: float) -> float:
    """The budget's clock less ours, as the least disturbed of the recent calls (``offsets``: each one's
    round trip and offset) shows it: the shortest round trip, the budget having run the call halfway
    through it; unless this call disagrees with it by more than their round trips allow (the budget's
    clock was stepped): then this call's. One offset for every start held, so a pacer's own starts keep
    their spacing."""
    rtt = answered - called
    seen = (slot.at or 0.0) - slot.wait - (called + rtt / 2)
    if offsets:
        best_rtt, best = min(offsets)
        if abs(seen - best) > (rtt + best_rtt) / 2 + ON_TIME:
            offsets.clear()
    offsets.append((rtt, seen))
    return min(offsets)[1]


def share_of(evidence: Evidence, now: float) -> float:
    """A pacer's part of the key's starts in the last minute, as the budget last counted them."""
    seen = evidence.seen
    if seen is None or not seen.starts:
        return 1.0
    ours = len(evidence.starts) - bisect.bisect_left(evidence.starts, now - WINDOW)
    return min(1.0, max(1 / MAX_BATCH, ours / seen.starts))


def answer_way(rtts: deque[float]) -> float:
    """How long an answer may take to come back: the longest round trip seen (a spike counting up to
    three typical ones) less the shortest way there, with a margin."""
    if not rtts:
        return 0.0
    longest = min(max(rtts), 3 * statistics.median(rtts))
    return (longest - min(rtts) / 2) * RETURN_MARGIN
