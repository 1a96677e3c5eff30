"""One rate budget per API key: where the next start time comes from, for everyone using the key.

The plan's limit belongs to the key, not to a process. A budget hands out start times for a key with
GCRA (a "theoretical arrival time", ``tat``): a reservation starts at ``max(tat, last + interval, now,
paused_until)`` and moves ``tat`` one interval past that start. The caller is told how long to wait,
so waiters never poll. A start is then *committed* (``commit``): the budget checks, atomically, that
the key's last committed start (``last``, every process's) is at least one interval back, and
records this one as the last. So the spacing counts from when each start really went out, not from
when it was due: a start that goes out late (a busy event loop, a slow process) pushes the next one
back instead of letting it close the gap. A reservation due at once is committed in the same call.
Nothing is leased: a process that dies holds nothing (at most the one slot it reserved goes unused).

The budget also remembers, per (key, service), what a run may reuse later (``recall``/``remember``):
when the key was last answered in each mode, whether a service's stated room was contradicted, and
the limits found. Entries carry the time they were written; readers judge their age. The key is
stored only as its short hash (``service.settings.key_hash``). ``"none"`` remembers nothing.

The budget also carries what every user of the key must hear at once: a 429 pause (every process
pauses, not only the one that got the 429), the pace in force when the service showed a lower limit,
and how many starts and 429s the key had in the last minute (the evidence the pacer judges a 429 by,
and what ``--dry-run`` shows). A pacer pushes these with its next reservation, in the same call.

Three places, chosen by a setting (``budget=`` / ``--budget`` / ``$BATCHSUM_BUDGET``):

- ``"machine"`` (the default): every batchsum process on this machine with the same key and base
  URL, through a small SQLite file in the user's cache folder (``platformdirs``), one row per budget,
  advanced in a ``BEGIN IMMEDIATE`` transaction; ``sqlite:///PATH`` names another file.
- ``"redis://HOST:PORT/DB"`` (or ``rediss://``): every process on every machine, through one Lua
  script that reads Redis' own ``TIME`` (no trust in the workers' clocks).
- ``"none"``: this process only (every batch in it with the same key and base URL shares one).

A budget is named by the client's ``identity``, a hash of base URL and key, never the key itself.

Shares. A run that may use only a fraction F of the key's rate (``share=``) reserves with a
``Share``: besides the key's ``tat`` the budget keeps one per shared run (its ``holder``), moved
``interval / F`` past each of its starts. Until that run's own ``tat`` has come, its reservation
reserves nothing on the key (the slot comes back ``deferred``, with the wait): it never holds a slot
of the key ahead of time, so the key's next slot stays free for everyone else, who are delayed by
at most the one slot the shared run took. Over any window the shared run holds at most
F x window / interval + 1 starts, and the others the rest, in the order they ask.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ...service.location import BUDGET, Location, machine_file
from ...service.settings import ENV_BUDGET, budget_spec
from .exchange import (
    AHEAD,
    COMMIT,
    ENTRY_CHARS,
    LEASE_SECONDS,
    LOOK,
    NO_REPORT,
    RECORD_SECONDS,
    RESERVE,
    RESERVE_ONLY,
    RUN_LEASE_SECONDS,
    SHARED_SECONDS,
    Budget,
    Lead,
    Member,
    QuotaCounts,
    Remembered,
    Report,
    RunEntry,
    Share,
    Slot,
)
from .gcra import KEEP_SECONDS, MAX_AHEAD, MAX_PAUSE, MINUTE, ON_TIME, REASON_CHARS, State, deferred, share_wait
from .ledger import KEEP_TICKS, LEDGER_SECONDS, Ledger, Tally, tick_of
from .redis_budget import RedisBudget
from .sqlite_budget import SQLiteBudget

__all__ = [
    "Budget",
    "ProcessBudget",
    "SQLiteBudget",
    "RedisBudget",
    "Report",
    "Slot",
    "Share",
    "Remembered",
    "Member",
    "RunEntry",
    "open_budget",
    "check_budget",
    "default_budget_path",
    "ENV_BUDGET",
    # the budget's pieces, at home in exchange.py and gcra.py
    "LOOK",
    "RESERVE",
    "COMMIT",
    "RESERVE_ONLY",
    "AHEAD",
    "NO_REPORT",
    "RECORD_SECONDS",
    "MAX_AHEAD",
    "ON_TIME",
    "MAX_PAUSE",
    "KEEP_SECONDS",
    "REASON_CHARS",
]


def default_budget_path() -> Path:
    """``budget.sqlite`` in the user's cache folder (``platformdirs``; honours ``$XDG_CACHE_HOME``)."""
    return machine_file(BUDGET)


class _Tallies:
    """The key's counts per tick (``ledger.TICK``) for the last three minutes, in memory, with the
    trailing minute's sums kept as the minute moves (a look is not a walk over every tick)."""

    def __init__(self) -> None:
        self._ticks: dict[int, list[int]] = {}
        self._order: list[int] = []  # the ticks held, ascending
        self._since: int | None = None  # the ticks from this one on are in the sums
        self._sums = [0, 0, 0]

    def add(self, tick: int, starts: int = 0, answered: int = 0, refused: int = 0) -> None:
        entry = self._ticks.get(tick)
        if entry is None:
            entry = self._ticks[tick] = [0, 0, 0]
            if self._order and tick < self._order[-1]:
                bisect.insort(self._order, tick)
            else:
                self._order.append(tick)
        for at, n in enumerate((starts, answered, refused)):
            entry[at] += n
            if self._since is not None and tick >= self._since:
                self._sums[at] += n

    def ended(self, now: float, report: Report) -> None:
        """The answers ``report`` tells of, each at the tick of its start (and the starts reserved
        ahead that went out)."""
        for age in report.started:
            self.add(tick_of(now - age), starts=1)
        for age in report.answered:
            self.add(tick_of(now - age), answered=1)
        for age in report.refused:
            self.add(tick_of(now - age), refused=1)

    def last_minute(self, now: float) -> tuple[int, int, int]:
        """(starts, refused, answered) of the last minute."""
        since = tick_of(now - MINUTE)
        order = self._order
        if self._since is None or since < self._since:  # the first look, or a clock that went back
            self._sums = [0, 0, 0]
            for tick in order[bisect.bisect_left(order, since) :]:
                self._sums = [a + b for a, b in zip(self._sums, self._ticks[tick])]
        else:
            for tick in order[bisect.bisect_left(order, self._since) : bisect.bisect_left(order, since)]:
                self._sums = [a - b for a, b in zip(self._sums, self._ticks[tick])]
        self._since = since
        if len(order) > 2 * KEEP_TICKS:  # forget what is older than three minutes
            gone = bisect.bisect_left(order, since - KEEP_TICKS)
            for tick in order[:gone]:
                del self._ticks[tick]
            del order[:gone]
        starts, answered, refused = self._sums
        return starts, refused, answered

    def since(self, tick: int) -> list[Tally]:
        return [Tally(t, *self._ticks[t]) for t in self._order[bisect.bisect_left(self._order, tick) :]]


class ProcessBudget(Budget):
    """The budget in this process's memory. Safe across threads and event loops (a thread lock,
    nothing awaited inside). ``ProcessBudget.for_key(id)`` is the one every batch in this process
    with that key shares; ``ProcessBudget()`` a private one (the engine's default, ``shared=False``)."""

    where = "this process"
    _registry: dict[str, ProcessBudget] = {}
    _registry_lock = threading.Lock()

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, shared: bool = False) -> None:
        self.shared = shared
        self._clock = clock
        self._lock = threading.Lock()
        self._state = State(
            tat=-math.inf,
            paused_until=-math.inf,
            last=-math.inf,
            pace_at=-math.inf,
            updated=-math.inf,
            held=-math.inf,
            live_next=-math.inf,
            live_until=-math.inf,
        )
        self._tallies = _Tallies()
        self._shares: dict[str, float] = {}  # holder -> its own tat
        self._lead: tuple[str | None, float, str | None, float] = (None, -math.inf, None, -math.inf)
        self.epoch = os.urandom(8).hex()
        self._runs: dict[str, tuple[str, str, float]] = {}  # member -> (run id, entry, seen)
        self._stops: dict[str, tuple[str, float]] = {}  # run id -> (cause, when)

    @classmethod
    def for_key(cls, key_id: str) -> ProcessBudget:
        with cls._registry_lock:
            return cls._registry.setdefault(key_id, cls(shared=True))

    async def _call(
        self,
        what: int,
        interval: float,
        report: Report,
        share: Share | None,
        count: int = 1,
        lead: float = 0.0,
        live: float = 0.0,
    ) -> Slot:
        with self._lock:
            now = self._clock()
            turn = None
            if what in (RESERVE, RESERVE_ONLY, AHEAD) and share is not None:
                count = 1  # a shared run's own schedule goes one start at a time
                turn = share_wait(self._shares.get(share.holder, -math.inf), now, share.own_interval(interval))
            step = self._state.advance(now, interval, report, LOOK if turn is not None else what, count, lead, live)
            if share is not None and what in (RESERVE, RESERVE_ONLY, AHEAD) and step.at is not None:
                if len(self._shares) > 1024:  # forget runs long gone
                    self._shares = {h: t for h, t in self._shares.items() if t > now - KEEP_SECONDS}
                self._shares[share.holder] = step.at + share.own_interval(interval)
            if step.committed:
                self._tallies.add(tick_of(now), starts=1)
            self._tallies.ended(now, report)
            slot = deferred(self._state.slot(now, step, *self._tallies.last_minute(now)), turn)
            return dataclasses.replace(slot, epoch=self.epoch, stop=self._registry_step(now, report))

    def _registry_step(self, now: float, report: Report) -> str | None:
        """The report's entry kept (lapsed ones dropped); the calling run's job's stop, if any."""
        if report.run is None:
            return None
        if report.entry is not None and len(report.entry) <= ENTRY_CHARS:
            self._runs[report.run.member] = (report.run.run_id, report.entry, now)
            self._runs = {m: e for m, e in self._runs.items() if e[2] >= now - RUN_LEASE_SECONDS}
        stop = self._stops.get(report.run.run_id)
        return stop[0] if stop is not None else None

    async def runs(self) -> list[RunEntry]:
        with self._lock:
            now = self._clock()
            found = (
                RunEntry.read(run_id, member, entry, seen, now)
                for member, (run_id, entry, seen) in self._runs.items()
                if seen >= now - RUN_LEASE_SECONDS
            )
            return [entry for entry in found if entry is not None]

    async def leave(self, member: Member) -> None:
        with self._lock:
            self._runs.pop(member.member, None)

    async def post_stop(self, run_id: str, cause: str) -> None:
        with self._lock:
            self._stops[run_id] = (cause, self._clock())

    async def ledger(self, seconds: float = LEDGER_SECONDS) -> Ledger:
        with self._lock:
            now = self._clock()
            return Ledger.of(now, self._tallies.since(tick_of(now - seconds)), seconds)

    async def lead(self, holder: str, state: str | None = None, *, release: bool = False) -> Lead:
        with self._lock:
            now = self._clock()
            held, until, published, at = self._lead
            if held is None or held == holder or until < now:
                if state is not None:
                    published, at = state, now
                held, until = (None, -math.inf) if release else (holder, now + LEASE_SECONDS)
            self._lead = (held, until, published, at)
            fresh = published if now - at <= SHARED_SECONDS else None
            return Lead(held, fresh, at, now)

    async def quota_claim(
        self, periods: Sequence[tuple[str, float]], limit: int | None, epoch: str | None = None
    ) -> QuotaCounts:
        with self._lock:  # shared by threads and event loops: one count at a time
            return await super().quota_claim(periods, limit, epoch)

    async def quota_give_back(self, periods: Sequence[str]) -> None:
        with self._lock:
            await super().quota_give_back(periods)

    async def quota_restore(self, into: str, old: str, counts: Sequence[tuple[str, int, float]]) -> None:
        with self._lock:
            await super().quota_restore(into, old, counts)


async def check_budget(budget: Budget) -> None:
    """``budget.check()``, then let go of the connection made for it (it belongs to this loop)."""
    try:
        await budget.check()
    finally:
        await budget.aclose()


def open_budget(where: Location | Budget | str | None, identity: str) -> Budget:
    """The budget ``where`` names (``RunSpec.budget``) for a key's ``identity`` (``AsyncClient.identity``,
    a hash of base URL and key): a ``Budget`` as it is; a ``Location`` (a text is parsed as the option's;
    None reads ``$BATCHSUM_BUDGET``, else the machine's): this process's, a SQLite file's, a Redis'.
    ``BudgetError`` for a place that names no budget (nothing is connected yet: ``await check()``)."""
    if isinstance(where, Budget):
        return where
    place = budget_spec(None) if where is None else Location.of(where, BUDGET, f"--budget, budget= or ${ENV_BUDGET}")
    if place.redis:
        return RedisBudget(place, identity)
    path = place.file
    if path is None:  # this process only
        return ProcessBudget.for_key(identity)
    return SQLiteBudget(path, identity, default=place.is_machine)
