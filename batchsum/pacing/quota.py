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

from ..service.errors import BudgetError
from ..service.keys import ADJECTIVES, PERIODS, Quota, period_window
from ..service.retry import MAX_RETRY_AFTER
from .exchange import Budget, BudgetReset

__all__ = ["Spent", "StatedQuota", "CountedQuota", "LONG_RETRY_AFTER", "utc", "window_name"]

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


class CountedQuota:
    """Paid requests counted on the key's ``budget`` in UTC calendar periods (its hour, day and
    month), by every run on the key, whether it configured a quota or not, so that the count a
    configured ``quota`` (``Quota``) is held to is everything the key's runs paid: ``claim`` counts one
    paid request before it starts (None: the quota is spent), ``give_back`` uncounts one the service
    did not bill (``engine.tally.charge``). With no ``quota``, it counts and never refuses. ``wall``: the
    Unix time now, the periods' clock. Each claim carries the budget's epoch as this run knows it: a
    budget that came back empty refuses it (``BudgetReset``), and the quota's count is restored to at
    least what this run last saw counted before it counts again."""

    __slots__ = ("quota", "budget", "used", "wall", "epoch", "_seen", "_one")

    def __init__(self, quota: Quota | None, budget: Budget, wall: Callable[[], float] = time.time) -> None:
        self.quota = quota
        self.budget = budget
        self.used: int | None = None  # the count of the quota's period after our last claim (every run's)
        self.wall = wall
        self.epoch: str | None = None  # the budget's epoch at our first claim
        self._seen: tuple[str, int] | None = None  # the first period's name and its count after our last claim
        # A few counts at a time: a batch's attempts all claim at once, and each call is a command on
        # the budget (a Redis connection each, of a pool of 100); a few keep a far budget's round
        # trips from capping the pace (one at a time, 30 ms apart, is 2000 a minute).
        self._one = asyncio.Semaphore(CLAIMS_AT_ONCE)

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
            try:
                used = await self.budget.quota_claim(periods, limit, self.epoch)
            except BudgetReset as reset:  # it came back empty: what we saw counted goes back first
                if self._seen is not None and self._seen[0] == periods[0][0]:
                    await self.budget.quota_restore(periods[0][0], self._seen[1], periods[0][1])
                self.epoch = reset.epoch
                used = await self.budget.quota_claim(periods, limit, self.epoch)
            self.epoch = self.epoch or self.budget.epoch or None
            self._seen = (periods[0][0], limit if used is None and limit is not None else used or 0)
        if used is None:
            self.used = limit
            return None
        self.used = used
        return tuple(name for name, _ in periods)

    async def give_back(self, periods: tuple[str, ...]) -> None:
        """Uncount one request; a budget out of reach keeps it counted (one too many: never one too few)."""
        async with self._one:
            try:
                await self.budget.quota_give_back(periods)
            except BudgetError as exc:
                log.debug("a count could not be given back to the budget: %s", exc)

    def spent(self) -> Spent:
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
