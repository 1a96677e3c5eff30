"""What a run publishes of itself on each of its keys' budgets (``Entry``: its entry in the runs'
registry, which ``batchsum top`` reads): host, pid, door, output (redacted), its limit and source,
share, sent, reused, 429s, rows left and ETA where it knows its size, its own rate, when it started,
what it waits for when every key's quota is spent, and its claims on the key's quota that may still
be given back; a gateway's queue and its requests' waits for their turn instead of rows.

It goes with the calls the run's pacer makes anyway, at most once a second (``pacing.budgets.presence``); a
run whose pacer is quiet (a pause, rows the store answers, a wait on a claim) publishes on a call of
its own every ``KEEP_ALIVE_SECONDS``, so that its entry lapses (``RUN_LEASE_SECONDS``) only when the
run is gone. The entry is removed when the run closes.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import socket
import time
from collections.abc import Callable
from contextlib import AsyncExitStack, suppress
from typing import TYPE_CHECKING, Any

from ..engine.tally import BatchStats
from ..pacing.budgets.exchange import NO_REPORT, RUN_LEASE_SECONDS, Budget, Slot
from ..pacing.budgets.presence import Presence, member_of
from ..service.errors import BudgetError, redact_location
from ..service.settings import environment
from .spec import RunSpec

if TYPE_CHECKING:
    from ..data.datasets import DatasetOutput
    from ..engine.lanes import KeyLane

__all__ = ["Entry", "open_entry", "ENV_HOST", "KEEP_ALIVE_SECONDS", "OUTPUT_CHARS", "RATE_SECONDS"]

log = logging.getLogger("batchsum")

ENV_HOST = "BATCHSUM_HOST"  # the host a run names itself by (default: the machine's name)
KEEP_ALIVE_SECONDS = RUN_LEASE_SECONDS / 3  # a quiet run publishes on a call of its own this often
# An entry asked for at once goes with the pacer's next call when one comes within this, else on a call
# of its own: a busy run (a gateway's, a claim on the quota at every request) makes no call more for it.
# Well inside PUBLISH_SECONDS, the lag others allow an entry (``quota.OtherClaims.held``).
CARRIED_SECONDS = 0.25
OUTPUT_CHARS = 240  # an output's location longer than this is shown by its ends
RATE_SECONDS = 60.0  # a run's own rate: its starts on the key in the trailing minute


def host_name() -> str:
    """The host a run names itself by: ``$BATCHSUM_HOST`` (tests; a container's name), else the machine's."""
    return environment().get(ENV_HOST, "").strip() or socket.gethostname()


def _shown(location: str | None) -> str | None:
    """A location as every message shows it (credentials out), its middle cut when long."""
    if not location:
        return None
    text = redact_location(str(location))
    if len(text) <= OUTPUT_CHARS:
        return text
    half = (OUTPUT_CHARS - 1) // 2
    return text[:half] + "…" + text[-half:]


class _Trailing:
    """A count's samples (one per publication, at most one a second), for its growth over the trailing
    minute: the run's starts and rows done."""

    __slots__ = ("times", "values")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.values: list[int] = []

    def add(self, now: float, value: int) -> None:
        self.times.append(now)
        self.values.append(value)
        if self.times[0] < now - 2 * RATE_SECONDS:
            gone = bisect.bisect_left(self.times, now - RATE_SECONDS - 1.0)
            del self.times[:gone], self.values[:gone]

    def since(self, now: float, seconds: float, start: float) -> tuple[int, float]:
        """How much the count grew over the trailing ``seconds`` (from 0 at ``start`` when younger),
        and over how long."""
        at = bisect.bisect_right(self.times, now - seconds) - 1
        if at < 0:
            return self.values[-1], max(1e-9, now - start)
        return self.values[-1] - self.values[at], max(1e-9, now - self.times[at])


class Entry(Presence):
    """One run on one key's budget: the pacer's ``Presence`` (its calls stamp the entry), the entry it
    publishes (``entry``), the run's key there (``lane``, once made) and what the run counts (``stats``)."""

    def __init__(
        self,
        run_id: str,
        budget: Budget,
        spec: RunSpec,
        stats: BatchStats,
        *,
        shared: bool,
        output: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(member_of(run_id), self.entry, clock=clock)
        self.budget = budget
        self.stats = stats
        self.lane: KeyLane | None = None
        self._started, self._started_at = clock(), wall()
        self._fixed = {
            "host": host_name(),
            "pid": os.getpid(),
            "door": spec.door,
            "output": _shown(output or spec.journal),
            "share": spec.share,
            "quota": None if spec.quota is None else str(spec.quota),
            "started_at": round(self._started_at, 3),
        }
        self._rpm, self._shared = spec.rpm, shared
        self._starts, self._done = _Trailing(), _Trailing()
        self.last = -float("inf")  # when the entry was last described for publication (the clock)
        self._now = asyncio.Event()  # the entry to be published at once, on a call of its own if need be

    def entry(self) -> dict[str, Any]:
        """The entry as published now (plain JSON; never a secret): asked only when one is due."""
        now = self.last = self._clock()
        stats, lane = self.stats, self.lane
        sent = lane.requests if lane is not None else stats.requests
        self._starts.add(now, sent)
        self._done.add(now, stats.done)
        rate, _ = self._starts.since(now, RATE_SECONDS, self._started)
        left = None if self._shared or stats.total is None else max(0, stats.total - stats.done)
        done, seconds = self._done.since(now, RATE_SECONDS, self._started)
        eta = None if left is None or done <= 0 else round(left * seconds / done, 1)
        source = lane.limit_source() if lane is not None else None
        return {
            **self._waits(now),
            **self._fixed,
            "rpm": lane.limit() if lane is not None else self._rpm,
            "source": None if source is None else source.kind,
            "pace": round(lane.pacer.pace, 3) if lane is not None else None,
            "sent": sent,
            "reused": stats.reused,
            "rate_limited": lane.rate_limited if lane is not None else stats.rate_limited,
            "done": stats.done,
            "total": None if self._shared else stats.total,
            "rows_left": left,
            "rate_1m": rate,
            "eta_s": eta,
            "waiting": stats.waiting,  # every key's quota spent: what the run waits for
            # its claims on the key's quota counted and not settled: another run refused by the count
            # waits for them, since each may still be given back (``CountedQuota.held_elsewhere``)
            "quota_pending": lane.counted.pending if lane is not None and lane.counted is not None else 0,
        }

    def attach(self, lane: KeyLane) -> None:
        """The run's key on this budget: its figures published here, and its quota's claims under
        this entry's name (published at once whenever they start or stop being pending)."""
        self.lane = lane
        if lane.counted is not None:
            lane.counted.others.publish(self.member.member, self.publish_now)

    def publish_now(self) -> None:
        """The entry published now: with the pacer's next call, else (none within ``CARRIED_SECONDS``) on
        a call of its own (its claims on the quota started or stopped being pending: a run refused by
        the count waits on them, and a far budget's starts, reserved ahead, make no call to carry them)."""
        self.published()
        self._now.set()

    def heard(self, slot: Slot) -> None:
        """What the budget answered a call of the run's (the pacer's, or the keep-alive's): its job's
        stop, and its epoch, which the key's quota counts hear at once (a budget back empty gets back
        what this run saw counted, even while the run waits on a spent quota and its pacer is quiet)."""
        super().heard(slot)
        counted = self.lane.counted if self.lane is not None else None
        if counted is not None:
            counted.seen.heard(slot.epoch)

    def _waits(self, now: float) -> dict[str, Any]:
        """A gateway's own figures (``stats.waits``): its queue and its requests' waits for their turn
        in the trailing minute; nothing for a run of rows."""
        waits = self.stats.waits
        if waits is None:
            return {}
        p50, p95 = waits.percentiles(now)
        return {
            "queue": waits.waiting,
            "wait_p50_s": None if p50 is None else round(p50, 4),
            "wait_p95_s": None if p95 is None else round(p95, 4),
        }

    async def keep_alive(self) -> None:
        """Publish on a call of the run's own whenever its pacer made none for ``KEEP_ALIVE_SECONDS``,
        or when asked (``publish_now``) and no call of the pacer's carried it within ``CARRIED_SECONDS``."""
        while True:
            wait = self.last + KEEP_ALIVE_SECONDS - self._clock()
            if wait > 0 and not self._now.is_set():
                with suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._now.wait(), min(wait, KEEP_ALIVE_SECONDS))
                continue
            if self._now.is_set():  # asked at once: the pacer's next call carries it, if one comes soon
                self._now.clear()
                asked = self._clock()
                await asyncio.sleep(CARRIED_SECONDS)
                if self.last >= asked and not self._now.is_set():
                    continue
            self._now.clear()
            report = self.stamp(NO_REPORT)
            if report.entry is None:  # published less than PUBLISH_SECONDS ago, after all
                continue
            try:
                self.heard(await self.budget.reserve(0.0, report, start=False))
            except BudgetError:  # the pacer finds out for itself; the entry lapses meanwhile
                self.last = self._clock()
            except Exception:  # a fault of ours never stops the run: it goes on unlisted
                log.warning("batchsum: the run's entry on the key's budget could not be published", exc_info=True)
                return

    async def leave(self) -> None:
        try:
            await self.budget.leave(self.member)
        except BudgetError:  # the budget is gone: the entry lapses on its own
            pass


def open_entry(
    stack: AsyncExitStack,
    run_id: str,
    budget: Budget,
    spec: RunSpec,
    stats: BatchStats,
    *,
    shared: bool,
    output: DatasetOutput | None = None,
) -> Entry:
    """The run's entry on ``budget``, kept alive while the run is open, removed when it closes."""
    entry = Entry(run_id, budget, spec, stats, shared=shared, output=output.path if output is not None else None)
    stack.push_async_callback(entry.leave)
    task = asyncio.ensure_future(entry.keep_alive())

    async def stop() -> None:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(stop)
    return entry
