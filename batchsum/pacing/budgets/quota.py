"""A key's quotas longer than a minute: the one configured (``CountedQuota``: N paid requests a UTC
hour, day or month, counted on the key's budget by every process and machine using the key, with a
quota or without), and the one
the service states (``StatedQuota``: the room its headers leave in a quota, or a 429 whose
Retry-After is longer than a per-minute limit ever asks); and what a spent quota means (``Spent``:
which quota, until when).

Invariants: a configured quota's count on the budget never passes its limit (a request is counted
before it starts, and given back only when its answer shows it was not billed: a 429, a refusal of
the key, a 422, a 5xx; ``engine.tally.charge`` says which); starts on a
stated quota never outnumber what the service stated it has left, less what of ours it may not have
counted yet; neither ever moves the per-minute pace, which stays the pacer's.
"""

from __future__ import annotations

import asyncio
import bisect
import datetime as _dt
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...service.errors import BudgetError
from ...service.key_plans import ADJECTIVES, PERIODS, Quota, period_window
from ...service.retry import MAX_RETRY_AFTER
from .exchange import Budget, BudgetReset, QuotaCounts

__all__ = ["Spent", "StatedQuota", "CountedQuota", "SeenCounts", "LONG_RETRY_AFTER", "utc", "window_name"]

log = logging.getLogger("batchsum")

# The one threshold between a pause and a quota spent: a wait the service asks for (a 429's
# Retry-After) or states (a quota's reset) at most this long is a per-minute limit's "later", even
# when the reset reads a little over a minute (a Unix time on a clock a few seconds off): the key
# pauses, never leaves the run, and nothing is remembered of it. Longer: a quota spent.
LONG_RETRY_AFTER = MAX_RETRY_AFTER
_NAMED = {3600: "hour", 86_400: "day"}


def utc(wall: float) -> str:
    """``2026-11-27 00:00 UTC``: how a reset is shown."""
    return _dt.datetime.fromtimestamp(wall, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def window_name(seconds: float | None) -> str:
    """How a stated window reads: ``daily``, ``hourly``, ``monthly`` (28-31 days), else its length."""
    if seconds is None:
        return "stated"
    if int(seconds) in _NAMED:
        return ADJECTIVES[_NAMED[int(seconds)]]
    if 28 * 86_400 <= seconds <= 31 * 86_400:
        return ADJECTIVES["month"]
    return f"{seconds / 3600:g}-hour" if seconds % 3600 == 0 else f"{seconds:g}-second"


@dataclass(frozen=True)
class Spent:
    """A key's quota spent: ``name`` (``daily quota of 300 (stated by the service)``) and ``until``
    (Unix time) when it comes back."""

    name: str
    until: float

    def describe(self) -> str:
        return f"{self.name} until {utc(self.until)}"

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "until": round(self.until, 3)})

    @classmethod
    def from_json(cls, text: str) -> Spent | None:
        try:
            data = json.loads(text)
            spent = cls(str(data["name"]), float(data["until"]))
        except (ValueError, TypeError, KeyError):
            return None
        return spent if math.isfinite(spent.until) else None


class StatedQuota:
    """The room the service states in a quota longer than a minute: ``left`` starts (None: nothing
    stated), counted down by each start and renewed by each answer (its ``quota_remaining``, less our
    starts after the stating attempt's: the service may not have counted them yet); the figure kept
    is that of the latest-started attempt answered (an earlier one arriving late says less of what
    others on the key spent since: other processes' starts count, and a ``Remaining: 0`` spends it);
    ``until``/``wall_until`` its reset on the pacer's clock and as a Unix time; ``limit``/``window``
    the quota stated with it."""

    __slots__ = ("left", "until", "wall_until", "limit", "window", "news", "_starts", "_wall", "_at")

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.left: int | None = None
        self.until = -math.inf
        self.wall_until: float | None = None
        self.limit: int | None = None
        self.window: float | None = None
        self.news = False  # a quota stated that the key's record has not heard of yet
        self._starts: list[float] = []
        self._wall = wall
        self._at = -math.inf  # the start of the attempt whose statement ``left`` comes from

    def started(self, now: float) -> None:
        self._starts.append(now)
        if self._starts[0] < now - 600:
            del self._starts[: bisect.bisect_left(self._starts, now - 300)]
        if self.left is not None:
            self.left -= 1

    def stated(
        self, remaining: int | None, reset: float | None, limit: int | None, window: float | None, at: float, now: float
    ) -> None:
        """An answer to the attempt started ``at`` states ``remaining`` of a quota (``limit`` per
        ``window``) until ``reset`` seconds from ``now``."""
        if limit is not None and (limit, window) != (self.limit, self.window):
            self.limit, self.window, self.news = limit, window, True
        if remaining is None or reset is None:
            return
        fresh = now >= self.until  # the last statement's period has ended: this is a new one
        if not fresh and self.left is not None and at < self._at:
            return  # an answer to an earlier attempt: a later one has said more since
        later = len(self._starts) - bisect.bisect_right(self._starts, at)
        self.left, self._at = remaining - later, at
        self.until, self.wall_until = now + reset, self._wall() + reset
        self.news = self.news or fresh

    def lasts(self, now: float) -> bool:
        """A quota to spend and remember: no reset stated, or one further than ``LONG_RETRY_AFTER``
        (one that resets sooner is a pause, whatever its window)."""
        return self.wall_until is None or self.until - now > LONG_RETRY_AFTER

    def allows(self, now: float, reserved: int = 0) -> bool:
        """May another start go on this quota, with ``reserved`` admitted and not started yet? Yes,
        unless the room stated is used up before its reset."""
        if self.left is None or now >= self.until:
            return True
        return self.left - reserved > 0

    def spent(self) -> Spent:
        """The stated quota, used up: what it is and when it comes back."""
        name = f"{window_name(self.window)} quota" + (f" of {self.limit}" if self.limit is not None else "")
        return Spent(f"{name} (stated by the service)", self.wall_until or self._wall())

    def describe(self) -> str | None:
        """``about 45 left in the daily quota of 300 until 2026-11-27 00:00 UTC`` (None: nothing stated)."""
        if self.left is None or self.wall_until is None:
            return None
        name = f"{window_name(self.window)} quota" + (f" of {self.limit}" if self.limit is not None else "")
        return f"about {max(0, self.left)} left in the {name} until {utc(self.wall_until)}"


CLAIMS_AT_ONCE = 8  # a run's count calls on one key's budget at once
RESTORED = "the quota's counts this run saw there are restored: "


class SeenCounts:
    """What a run saw counted on its key's ``budget``, every period (its most, less what it gave back
    since), and on which ``epoch``: told another epoch (``heard``, from any call of the run: a claim,
    the pacer's, the entry's keep-alive), the budget came back empty, and what it saw is restored at
    once, added to what the new epoch counted since (``Budget.quota_restore``: each old epoch's count
    once, however many runs remember it). ``wall``: the Unix time now."""

    __slots__ = ("budget", "wall", "epoch", "counts", "_restoring")

    def __init__(self, budget: Budget, wall: Callable[[], float]) -> None:
        self.budget = budget
        self.wall = wall
        self.epoch: str | None = None  # the budget's epoch the counts were seen on (None: none seen yet)
        self.counts: dict[str, tuple[int, float]] = {}  # period -> (its count as seen, when the count may go)
        self._restoring: asyncio.Task[None] | None = None

    def saw(self, found: QuotaCounts, periods: list[tuple[str, float]]) -> None:
        """A claim's answer: each period's count (kept ``periods``' seconds)."""
        self.epoch = self.epoch or found.epoch
        wall = self.wall()
        for (name, keep), count in zip(periods, found.counts):
            self.counts[name] = (max(self.counts.get(name, (0, 0.0))[0], count), wall + keep)

    def gave_back(self, periods: tuple[str, ...]) -> None:
        for name in periods:
            if name in self.counts:
                count, until = self.counts[name]
                self.counts[name] = (max(0, count - 1), until)

    def heard(self, epoch: str) -> None:
        """The budget answered a call of the run's with ``epoch``: another than the one the counts were
        seen on means it came back empty, and they are restored at once (in a task of their own)."""
        if not epoch or epoch == self.epoch:
            return
        if self.epoch is None:  # nothing counted yet: nothing to restore
            self.epoch = epoch
            return
        if self._restoring is None or self._restoring.done():
            self._restoring = asyncio.ensure_future(self._restore(epoch))
            self._restoring.add_done_callback(_looked_at)

    async def restored(self) -> None:
        """Once a restore under way is done (one that failed raises its error here, as a claim's call
        would, and the next claim on the old epoch tries it again)."""
        restoring = self._restoring
        if restoring is not None:
            if restoring.done():
                self._restoring = None
            await asyncio.shield(restoring)

    async def _restore(self, into: str) -> None:
        """What was seen on our epoch, every period still running, added to the budget's now (``into``,
        or a later one if it came back empty again meanwhile); then ours is ``into``."""
        while into != self.epoch:
            old, counts = self.epoch, self._running()
            try:
                if old is not None and counts:
                    await self.budget.quota_restore(into, old, counts)
            except BudgetReset as reset:
                into = reset.epoch
                continue
            self.epoch = into
            if counts:
                said = ", ".join(f"{count} in {name}" for name, count, _ in counts)
                log.warning("batchsum: the rate budget at %s came back empty: %s", self.budget.where, RESTORED + said)

    def _running(self) -> list[tuple[str, int, float]]:
        """Each period still running seen counted: its name, its count, the seconds it is kept."""
        wall = self.wall()
        self.counts = {name: seen for name, seen in self.counts.items() if seen[1] > wall}
        return [(name, count, until - wall) for name, (count, until) in self.counts.items() if count > 0]

    async def close(self) -> None:
        if self._restoring is not None:
            await asyncio.gather(self._restoring, return_exceptions=True)


class CountedQuota:
    """Paid requests counted on the key's ``budget`` in UTC calendar periods (its hour, day and
    month), by every run on the key, whether it configured a quota or not, so that the count a
    configured ``quota`` (``Quota``) is held to is everything the key's runs paid: ``claim`` counts one
    paid request before it starts (None: the quota is spent), ``settle`` tells what its answer was
    (not billed, ``engine.tally.charge``: the count given back). With no ``quota``, it counts and never
    refuses. ``wall``: the Unix time now, the periods' clock. One per run and key: every batch of the
    run on the key (DuckDB's threads) claims through it, so ``pending`` is every claim of the run that
    may still be given back. What it saw counted is ``seen``'s, restored to a budget that came back
    empty; a claim carries the epoch it was seen on and counts nothing on another, so no claim is
    counted from zero before the restore is done."""

    __slots__ = ("quota", "budget", "used", "wall", "seen", "pending", "returned", "_one", "_giving", "_moved")

    def __init__(self, quota: Quota | None, budget: Budget, wall: Callable[[], float] = time.time) -> None:
        self.quota = quota
        self.budget = budget
        self.used: int | None = None  # the count of the quota's period after our last claim (every run's)
        self.wall = wall
        self.seen = SeenCounts(budget, wall)
        self.pending = 0  # our claims counted and not settled: each may still be given back
        self.returned = 0  # our claims given back so far: a refusal before one may be wrong now
        # A few counts at a time: a batch's attempts all claim at once, and each call is a command on
        # the budget (a Redis connection each, of a pool of 100); a few keep a far budget's round
        # trips from capping the pace (one at a time, 30 ms apart, is 2000 a minute).
        self._one = asyncio.Semaphore(CLAIMS_AT_ONCE)
        self._giving: set[asyncio.Task[None]] = set()  # counts given back, under way
        self._moved: asyncio.Future[None] | None = None  # resolved when a count comes back or none is pending

    def _periods(self) -> list[tuple[str, float]]:
        """The periods now, the quota's first: each's name and the seconds its count is kept."""
        wall = self.wall()
        first = self.quota.period if self.quota is not None else PERIODS[0]
        periods = []
        for period in sorted(PERIODS, key=lambda name: name != first):
            name, _, end = period_window(period, wall)
            periods.append((name, end - wall + 3600))
        return periods

    async def claim(self) -> tuple[str, ...] | None:
        """Count one request in the periods now; their names to give it back by, or None when the
        quota is spent."""
        periods = self._periods()
        limit = self.quota.limit if self.quota is not None else None
        async with self._one:
            while True:
                await self.seen.restored()
                try:
                    found = await self.budget.quota_claim(periods, limit, self.seen.epoch)
                    break
                except BudgetReset as reset:  # back empty: what we saw counted goes back first
                    self.seen.heard(reset.epoch)
        self.seen.saw(found, periods)
        self.used = found.counts[0]
        if not found.counted:
            return None
        self.pending += 1
        return tuple(name for name, _ in periods)

    def settle(self, periods: tuple[str, ...], *, paid: bool) -> None:
        """A claimed request ended: paid (its count stays), or not billed and given back on the budget,
        in a task of its own (the attempt's end does not wait for it)."""
        if paid:
            self._settled(returned=False)
            return
        task = asyncio.ensure_future(self._give_back(periods))
        self._giving.add(task)
        task.add_done_callback(self._giving.discard)

    async def _give_back(self, periods: tuple[str, ...]) -> None:
        """Uncount one request; a budget out of reach keeps it counted (one too many: never one too few)."""
        returned = False
        try:
            async with self._one:
                await self.budget.quota_give_back(periods)
            returned = True
            self.seen.gave_back(periods)
        except BudgetError as exc:
            log.debug("a count could not be given back to the budget: %s", exc)
        finally:
            self._settled(returned)

    def _settled(self, returned: bool) -> None:
        self.pending -= 1
        self.returned += returned
        if (returned or not self.pending) and self._moved is not None:
            if not self._moved.done():
                self._moved.set_result(None)
            self._moved = None

    async def moved(self, timeout: float) -> None:
        """Until a count of ours comes back or none is pending any more, or ``timeout`` seconds."""
        if self._moved is None:
            self._moved = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._moved), timeout)
        except asyncio.TimeoutError:
            pass

    async def close(self) -> None:
        """Wait for the give-backs and a restore under way: done before the run's budget closes."""
        while self._giving:
            await asyncio.gather(*self._giving, return_exceptions=True)
        await self.seen.close()

    def spent(self) -> Spent:
        """The configured quota, spent: what it is and when it comes back."""
        assert self.quota is not None
        _, _, end = self.quota.window(self.wall())
        return Spent(f"{self.quota.name} (configured)", end)

    def describe(self) -> str | None:
        """``45 left in the daily quota of 300 until ...`` (None: no quota configured)."""
        if self.quota is None:
            return None
        _, _, end = self.quota.window(self.wall())
        used = "?" if self.used is None else max(0, self.quota.limit - self.used)
        return f"{used} left in the {self.quota.name} until {utc(end)}"


def _looked_at(task: asyncio.Task[None]) -> None:
    """A restore's failure is the next claim's to raise (and it tries again); here it is only read."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("a quota's counts could not be restored yet: %s", task.exception())
