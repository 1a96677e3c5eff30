"""Which key sends (``Keys``): a request goes to the key with free capacity whose next start comes
first; each key's first request goes alone, every key's at once; a key refused (401) or out of quota
leaves the run (``KeyOut`` moves what waited on it to the others), and a key its record knows spent
starts out of it; when every key is out the run waits for the first back within ``max_wait``, or
stops (the last refusal, or ``QuotaSpent``), as ``pacing.look.forecast.first_back`` decides (a dry run
projects the run by the same function).

Invariant: a key is given no more requests than its pacer lets be in flight (its budget's pace decides
when each starts), so a key slowed by other runs on its budget takes fewer, and none waits on a key
while another has room; with one key the choice costs nothing and nothing changes."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from ..pacing import KeyRecord
from ..pacing.budgets.quota import Spent, utc
from ..pacing.look.forecast import KeyNow, first_back, key_now
from ..service.errors import APIStatusError, AuthenticationError, NotPremiumError, QuotaSpent
from .lanes import KeyLane
from .tally import BatchStats

__all__ = ["Keys", "KeyOut", "LaneState", "FirstRequest", "RunWait", "lane_now", "wall_of"]

T = TypeVar("T")
RECHECK = 0.5  # seconds between looks while requests wait for a key (capacity grows with latency)
HORIZON = 1.0  # seconds: a key is given a request only when it would start it about this soon


class FirstRequest:
    """The first request goes alone: a wrong key or an expired plan costs one request, not dozens;
    unless the key's record proves it answered by this service in this mode within a day. What the
    run sees of the key goes to that record (an answer is told once). A first request whose turn
    went to another text (its text claimed by another run) is given back: the next one is the first."""

    __slots__ = ("answered", "sent", "record", "mode", "proven", "_moved")

    def __init__(self, record: KeyRecord | None, mode: int, *, alone: bool) -> None:
        self.answered = asyncio.Event()
        self.sent = False
        self.record = record
        self.mode = mode
        self.proven = False  # this run saw the key answered (the record is told once)
        self._moved: asyncio.Future[None] | None = None  # resolved when the first is answered or given back
        if not alone:
            self.answered.set()

    async def turn(self) -> bool:
        """Wait until a request may start; True for the first (the others wait for its answer)."""
        while not self.answered.is_set():
            if not self.sent:
                self.sent = True
                return True
            if self._moved is None or self._moved.done():
                self._moved = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._moved)
        return False

    def done(self) -> None:
        """The first request ended (answered, or refused): the others go."""
        self.answered.set()
        self._move()

    def given_back(self) -> None:
        """The first request did not go (its turn went to another text): one waiting goes first."""
        self.sent = False
        self._move()

    def _move(self) -> None:
        if self._moved is not None and not self._moved.done():
            self._moved.set_result(None)

    def key_answered(self) -> None:
        if self.record is not None and not self.proven:
            self.proven = True
            self.record.answered(self.mode)

    def key_refused(self, error: AuthenticationError | NotPremiumError) -> None:
        if self.record is not None:
            self.record.refused(self.mode if isinstance(error, NotPremiumError) else None)


class KeyOut(Exception):
    """The key an attempt waited on left the run (refused, or its quota spent): send it on another."""


class LaneState:
    """What a batch keeps of one key beyond ``KeyLane``: its first request, the requests given to it
    and not done with it (``assigned``), the attempts it holds reserved on a stated quota, and the
    future that resolves when it leaves the run. A key its record knows spent starts out."""

    __slots__ = ("lane", "first", "alone", "assigned", "reserved", "answered", "starts", "_gone")

    def __init__(self, lane: KeyLane, first: FirstRequest, alone: bool = False) -> None:
        self.lane = lane
        self.alone = alone  # the batch's one key: nothing to move to
        self.first = first
        self.assigned = 0
        self.reserved = 0
        self.answered = asyncio.Event()  # rung at each answer: a wait on a stated quota looks again
        self.starts: deque[float] = deque(maxlen=6)  # this run's last starts on the key
        self._gone: asyncio.Future[None] | None = None
        _spent_before(lane)

    def out(self, now: float) -> bool:
        return now < self.lane.out_until

    def sending(self, now: float) -> bool:
        """In the run and past its first request's answer, with its stated quota's room: a key that
        requests may queue for."""
        return not self.out(now) and self.first.answered.is_set() and self.lane.stated.allows(now, self.reserved)

    def capacity(self, now: float) -> int:
        """How many more requests this key may be given now."""
        lane = self.lane
        if self.out(now):
            return 0
        if not self.first.answered.is_set():
            return 0 if self.first.sent or self.assigned else 1
        if not lane.stated.allows(now, self.reserved):
            return 0
        return lane.pacer.in_flight.limit(now) - self.assigned

    def interval(self, now: float) -> float:
        """Seconds between this run's starts on the key: the pacer's, or slower when other runs share
        the key's budget (as the last starts showed, while requests waited here)."""
        interval, starts = self.lane.pacer.interval, self.starts
        if len(starts) == starts.maxlen and now - starts[-1] < 4 * max(interval, 0.05):
            interval = max(interval, (starts[-1] - starts[0]) / (len(starts) - 1))
        return interval

    def expected(self, now: float) -> float:
        """Seconds until a request given now would start here: those waiting before it, at the pace
        this run sees on the key."""
        pacer = self.lane.pacer
        waiting = max(0, self.assigned - pacer.in_flight.on_wire)
        return waiting * self.interval(now) + pacer.state().paused_for

    def started(self, now: float) -> None:
        self.starts.append(now)

    def gone(self) -> asyncio.Future[None]:
        """A future that resolves when the key leaves the run (at once while it is out)."""
        if self._gone is None or (self._gone.done() and not self.out(self.lane.pacer.now())):
            self._gone = asyncio.get_running_loop().create_future()
            if self.out(self.lane.pacer.now()):
                self._gone.set_result(None)
        return self._gone

    def leave(self) -> None:
        if self._gone is not None and not self._gone.done():
            self._gone.set_result(None)

    async def guard(self, awaitable: Coroutine[Any, Any, T]) -> T:
        """``awaitable``, unless the key leaves the run first (``KeyOut``); with one key, as it is."""
        if self.alone:
            return await awaitable
        task = asyncio.ensure_future(awaitable)
        gone = self.gone()
        try:
            await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise KeyOut


class RunWait:
    """What a run waits for while every key is out (``waits for the hourly quota of 10 ... to reset at
    ...``): said once (``news``), then shown on the bar and in the run's entry (``stats.waiting``)."""

    __slots__ = ("stats", "words")

    def __init__(self, stats: BatchStats | None) -> None:
        self.stats = stats
        self.words: str | None = None

    def news(self, words: str) -> bool:
        """The run waits (``words``): whether it is news, to be said."""
        if self.stats is not None:
            self.stats.waiting = words
        news, self.words = words != self.words, words
        return news

    def over(self) -> None:
        """A key sends again: the run waits no more."""
        if self.words is not None:
            self.words = None
            if self.stats is not None:
                self.stats.waiting = None


class Keys:
    """The keys of one batch (``lanes``) and who sends next: ``choose`` gives a request its key (or
    waits for one), ``release`` takes it back when the request is done with it. ``on_quota`` stops
    the batch when every key's quota is spent beyond ``max_wait``, else the run waits (``wait``)."""

    def __init__(
        self,
        lanes: Sequence[tuple[KeyLane, FirstRequest]],
        max_wait: float,
        on_quota: Callable[[QuotaSpent], None],
        stats: BatchStats | None = None,
    ) -> None:
        self.states = [LaneState(lane, first, len(lanes) == 1) for lane, first in lanes]
        self.single = len(self.states) == 1
        self.max_wait = max_wait
        self.on_quota = on_quota
        self.refusal: APIStatusError | None = None  # the last key's refusal: the batch's stop when none is left
        self.wait = RunWait(stats)  # every key out: what the run waits for (said once, then on the bar)
        self._waiters: deque[asyncio.Future[LaneState | None]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def now(self) -> float:
        return self.states[0].lane.pacer.now()

    async def choose(self) -> LaneState:
        """The key this request goes to; waits while none has room; raises when none is left."""
        while True:
            now = self.now()
            if all(state.out(now) for state in self.states):  # a stop, unless one comes back within max_wait
                _none_back(self, now)
            picked = None if self._waiters else self._pick(now)
            if picked is not None:
                picked.assigned += 1
                self.wait.over()
                return picked
            if self.single:  # its one key is out for a while: wait for it
                await asyncio.sleep(min(RECHECK, max(0.0, self.states[0].lane.out_until - now)))
                continue
            future: asyncio.Future[LaneState | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(future)
            self._arm()
            try:
                done, _ = await asyncio.wait({future}, timeout=RECHECK)
            except asyncio.CancelledError:
                _abandon(self._waiters, future)
                raise
            _abandon(self._waiters, future)
            if done and future.result() is not None:
                self.wait.over()
                return future.result()  # type: ignore[return-value]

    def _pick(self, now: float) -> LaneState | None:
        """The key where this request would start first, among those with room that would start it
        soon (within ``HORIZON``, or two of its intervals): a request is not queued long behind a key
        that other runs slow down, while a key sending now may free up; a key whose first request is
        unsent first. None: wait."""
        if self.single:
            state = self.states[0]
            return None if state.out(now) else state
        best, best_key = None, (math.inf, math.inf, 0)
        for index, state in enumerate(self.states):
            room = state.capacity(now)
            if room <= 0:
                continue
            if not state.first.sent:
                return state
            if not state.sending(now):
                continue
            expected = state.expected(now)
            if expected > max(HORIZON, 2 * state.interval(now)):
                continue
            key = (expected, state.assigned / max(1, room + state.assigned), index)
            if key < best_key:
                best, best_key = state, key
        return best

    def release(self, state: LaneState) -> None:
        state.assigned -= 1
        self.changed()

    def changed(self) -> None:
        """Something that frees a key happened (an attempt ended, a first answer, a key back): give
        the requests waiting their keys, in order."""
        if self.single or not self._waiters:
            return
        now = self.now()
        while self._waiters:
            state = self._pick(now)
            if state is None:
                break
            future = self._waiters.popleft()
            if not future.done():
                state.assigned += 1
                future.set_result(state)
        if self._waiters and all(s.out(now) for s in self.states):
            for future in list(self._waiters):  # each looks again: a stop, or the wait for a key back
                if not future.done():
                    future.set_result(None)
            self._waiters.clear()
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiters:
            self._timer = asyncio.get_running_loop().call_later(RECHECK, self.changed)

    # -- a key leaves the run -----------------------------------------------------------------------

    def refuse(self, state: LaneState, error: AuthenticationError | NotPremiumError) -> bool:
        """The service refused ``state``'s key (401): it leaves the run at once. Whether another key
        is left to send the request on."""
        lane = state.lane
        if lane.refusal is None:
            lane.refusal = error.message
            lane.out_until = math.inf
            self.refusal = error
            left = sum(1 for s in self.states if s.lane.refusal is None)
            if len(self.states) > 1 or lane.listed:  # the stop names it, as the lines do
                error.key_name, error.keys = lane.name, len(self.states)
            if left and lane.tell is not None:
                lane.tell(
                    f'{lane.name} refused: the service answered {error.status_code} "{error.message}"; '
                    f"it leaves the run, which goes on with {left} key{'s' if left != 1 else ''}"
                )
            state.leave()
            self.changed()
        return any(s.lane.refusal is None for s in self.states)

    def take_out(self, state: LaneState, until: float, spent: Spent, *, remember: bool = True) -> None:
        """``state``'s key has spent a quota (``spent``, kept as ``lane.spent``): out of the run until
        ``until`` (the pacer's clock); a key out for longer already stays as it is. ``remember``: the
        key's record keeps it, so every later run on the key starts with the key out; never a
        configured quota's (each run sets its own, and the budget's count, every process's, is what
        says it is spent)."""
        lane = state.lane
        if lane.out_until >= until:
            return
        # The same quota said already, the key out for it (each attempt it refused finds it so): said once.
        said = lane.spent_now() is not None and lane.spent is not None and lane.spent.describe() == spent.describe()
        lane.spent, lane.out_until = spent, until
        if lane.record is not None and remember and not said:
            lane.record.spent(lane.spent)
        if lane.tell is not None and not said:
            left = sum(1 for s in self.states if not s.out(self.now()))
            goes_on = f"the run goes on with {left} key{'s' if left != 1 else ''}" if left else "no key is left"
            lane.tell(f"{lane.name}: its {lane.spent.describe()}; it leaves the run until then ({goes_on})")
        state.leave()
        self.changed()


def _abandon(waiters: deque[asyncio.Future[LaneState | None]], future: asyncio.Future[LaneState | None]) -> None:
    """A waiter that stops waiting: its place in the queue given up (a key it was given is its own)."""
    if future.done() and not future.cancelled() and future.result() is not None:
        return
    if not future.done():
        future.cancel()
    try:
        waiters.remove(future)
    except ValueError:
        pass


def wall_of(lane: KeyLane) -> float:
    """The Unix time now, as the key's quotas count it (their periods, their resets)."""
    return lane.counted.wall() if lane.counted is not None else time.time()


def _spent_before(lane: KeyLane) -> None:
    """A key its record knows spent (by an earlier run, or another process) starts out of the run
    until the quota's reset (a run's pieces take it out when they open it, so that its first lines
    say so; a batch given lanes alone does it here)."""
    spent = lane.record.quota_spent() if lane.record is not None else None
    if spent is not None and lane.spent is None:
        lane.spent = spent
        lane.out_until = lane.pacer.now() + (spent.until - wall_of(lane))


def lane_now(lane: KeyLane, now: float) -> KeyNow:
    """What the key can do now (``pacing.look.forecast.key_now``), as the run holds it: its limit and the
    run's share of it, out until a quota spent comes back, or refused; on the pacer's clock."""
    out = (lane.out_until, lane.spent.name) if lane.spent is not None else None
    return key_now(lane.name, lane.limit(), now, share=lane.pacer.share, out=out, refusal=lane.refusal)


def _none_back(keys: Keys, now: float) -> None:
    """Every key of ``keys`` is out: the last refusal when none can come back; ``QuotaSpent`` (told
    to ``on_quota``) when the first back is further than ``max_wait``; else nothing (wait for it,
    said once)."""
    lanes = [state.lane for state in keys.states]
    held = [lane_now(lane, now) for lane in lanes]
    if all(key.refused for key in held):
        assert keys.refusal is not None
        raise keys.refusal
    waited = first_back(held, now, keys.max_wait)
    if waited is None:
        spent = [
            (lane.key_hash, lane.spent.name, lane.spent.until)
            for lane in lanes
            if lane.refusal is None and lane.spent is not None
        ]
        keys.on_quota(QuotaSpent(spent))
        raise asyncio.CancelledError
    lane = lanes[held.index(waited)]
    if lane.spent is not None:
        quota = f"{lane.spent.name} of {lane.name}" if len(lanes) > 1 else lane.spent.name
        words = f"waits for the {quota} to reset at {utc(lane.spent.until)}"
        if keys.wait.news(words) and lane.tell is not None:
            minutes = max(0.0, (waited.out_until or now) - now) / 60
            lane.tell(
                f"{'every key' if len(lanes) > 1 else lane.name}: quota spent; the run {words} "
                f"({minutes:.0f} min, within max_wait {keys.max_wait:g} s), then goes on"
            )
