"""Runs kept open for requests that come one at a time, each within its own deadline (``batchsum
gateway``'s): ``ServedRun``, one key's run (opened from a ``RunSpec`` like any run: client, budget,
pacer, answer store, entry in the runs' registry) with a batch open per mode (``engine.OpenBatch``);
``KeyRuns``, such runs by key, opened on a key's first request and closed when idle. What a request
gets (``Served``) is the service's answer (or the store's) with the service's own error answer to
hand on as it came, or, when its turn did not come by its deadline, when it would (a 429's
``Retry-After``), or that the key's budget is out of reach (a 503)."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..data.results import Answer
from ..engine.lanes import finish_lanes
from ..engine.open_batch import OpenBatch
from ..engine.tally import BatchStats, Waits
from ..pacing.budgets.outage import MAX_PROBE_SECONDS
from ..service import contract
from ..service.client import AsyncClient, AttemptHooks, PreparedRequest
from ..service.errors import APIError, APIStatusError, BatchsumError, BudgetError, QuotaSpent
from .report import write_report
from .run import Run
from .spec import RunSpec

__all__ = ["Served", "ServedRun", "KeyRuns", "IDLE_SECONDS", "RENEW_SECONDS", "WIRE_LOOK"]

log = logging.getLogger("batchsum")

IDLE_SECONDS = 300.0  # a key with no request this long has its run closed (its entry leaves top)
RENEW_SECONDS = 86_400.0  # a key's run is renewed daily: what a run keeps of its day (timeline, latencies) let go
WIRE_LOOK = 0.25  # seconds between looks at a request past its deadline that is on the wire (its answer is awaited)
LATE, UNAVAILABLE = 429, 503


@dataclass(frozen=True)
class Served:
    """What one request got: an ``answer`` (the service's, or the store's), with ``error`` the
    service's error answer behind a failed one (its status and body, the key taken out), to hand on
    as it came; or none, and ``status``: 429 (its turn, or a spent quota's reset, past its deadline)
    or 503 (the key's budget out of reach: nothing was sent), ``retry_after`` seconds and ``why``."""

    answer: Answer | None = None
    error: APIError | None = None
    status: int | None = None
    retry_after: float = 1.0
    why: str = ""


class _Told:
    """What a request's task met upstream: when its first attempt started (its turn on the key) and
    the service's last error answer."""

    __slots__ = ("started", "error")

    def __init__(self) -> None:
        self.started: float | None = None
        self.error: APIError | None = None


# By the engine's task that sends the request: a weak mapping, gone with the task.
_TOLD: weakref.WeakKeyDictionary[asyncio.Task[Any], _Told] = weakref.WeakKeyDictionary()


class _Timed:
    """The engine's attempt hooks, with the first attempt's start told (its turn came)."""

    __slots__ = ("hooks", "told")

    def __init__(self, hooks: AttemptHooks, told: _Told) -> None:
        self.hooks, self.told = hooks, told

    @property
    def max_wait(self) -> float:
        return self.hooks.max_wait

    @max_wait.setter
    def max_wait(self, value: float) -> None:
        self.hooks.max_wait = value

    @property
    def first_429(self) -> float | None:
        return self.hooks.first_429

    @first_429.setter
    def first_429(self, value: float | None) -> None:
        self.hooks.first_429 = value

    async def before_attempt(self) -> Any:
        ticket = await self.hooks.before_attempt()
        if self.told.started is None:
            self.told.started = time.monotonic()
        return ticket

    def after_attempt(self, ticket: Any, error: BaseException | None, limits: Any) -> None:
        self.hooks.after_attempt(ticket, error, limits)


class _Relay(AsyncClient):
    """batchsum's client, telling what each request met (``_Told``): its answers are handed on."""

    async def send(self, request: PreparedRequest, hooks: AttemptHooks | None = None) -> tuple[str, int]:
        task = asyncio.current_task()
        told = _TOLD.setdefault(task, _Told()) if task is not None else _Told()
        try:
            return await super().send(request, _Timed(hooks, told) if hooks is not None else None)
        except APIError as exc:
            told.error = exc
            raise


class _Late(Exception):
    """A request's deadline came before its turn."""


class _Stopping(Exception):
    """The door stops: a request not on the wire yet is answered at once (to ask another)."""


def _now() -> float:
    return asyncio.get_running_loop().time()


def _cancelling() -> bool:
    """Whether this task itself is being cancelled (its client went away, the server stops)."""
    task = asyncio.current_task()
    return task is not None and getattr(task, "cancelling", lambda: 0)() > 0


class ServedRun:
    """One key's run (or a set of held keys'), opened from ``spec``, a batch open per mode (a key
    not proven in mode 2 is served no mode-2 answer another key paid for); ``answer`` takes one
    request through it within its deadline; ``report``: where its run report is merged at its end;
    ``live``: the part of the key its requests may take ahead of the batch runs (``Run``'s)."""

    def __init__(
        self,
        spec: RunSpec,
        report: str | None = None,
        stopping: asyncio.Future[None] | None = None,
        live: float = 0.0,
    ) -> None:
        self.stopping = stopping  # resolved when the door stops: what waits for a turn is answered then
        self.waits = Waits()
        self.run = Run(spec, stats=BatchStats(waits=self.waits), client=_Relay, live=live)
        self.report = report
        self.busy = 0  # requests in it now
        self.used = self.opened = time.monotonic()  # when the last one left; when it opened
        self._batches: dict[int, OpenBatch] = {}
        self._waiters: dict[asyncio.Task[Answer], int] = {}

    async def open(self) -> ServedRun:
        await self.run.__aenter__()
        self.waits.wire = lambda: sum(lane.pacer.in_flight.on_wire for lane in self.run.pieces.lanes)
        return self

    def batch(self, mode: int) -> OpenBatch:
        """The open batch of ``mode``; a new one when the last was stopped (a refused key, a quota)."""
        batch = self._batches.get(mode)
        if batch is None or batch.stopped is not None:
            run = self.run
            batch = self._batches[mode] = OpenBatch(run.pieces.lanes, mode, run.options, run.store, run.stats)
        return batch

    async def answer(self, text: str, params: contract.Params, arrived: float, deadline: float) -> Served:
        """What one request gets (``text`` within the word limits): its answer, or the door's own when
        its turn did not come before ``deadline`` (the loop's clock). ``arrived``: when it came (the
        monotonic clock), for its wait."""
        waits = self.waits
        self.busy += 1
        waits.open += 1
        try:
            while True:
                batch = self.batch(params.mode)
                item = batch.request(text, params)  # its turn is taken through the key's pacer, as a run's
                if isinstance(item, Answer):
                    waits.waited(time.monotonic() - arrived)
                    return self._answered(batch, item, _Told())
                try:
                    answer = await self._await(batch, item, deadline)
                except asyncio.CancelledError:
                    if batch.stopped is None and _now() < deadline and not _cancelling():
                        continue  # the identical request it joined gave up its turn: it takes one of its own
                    raise
                except _Late:
                    waits.waited(time.monotonic() - arrived)
                    return self._late()
                except _Stopping:
                    waits.unavailable += 1
                    why = "the gateway is stopping; nothing was sent for this request: ask again"
                    return Served(status=UNAVAILABLE, retry_after=1.0, why=why)
                told = _TOLD.get(item) or _Told()
                waits.waited(max(0.0, (told.started or time.monotonic()) - arrived))
                return self._answered(batch, answer, told)
        except BatchsumError as exc:
            waits.waited(time.monotonic() - arrived)
            return _stopped(waits, exc)
        finally:
            self.busy -= 1
            waits.open -= 1
            self.used = time.monotonic()

    async def _await(self, batch: OpenBatch, task: asyncio.Task[Answer], deadline: float) -> Answer:
        """``task``'s answer; ``_Late`` when it has not started by ``deadline`` (once on the wire, its
        answer is awaited); what stopped the batch, raised, when it never went."""
        self._waiters[task] = self._waiters.get(task, 0) + 1
        awaited: set[asyncio.Future[Any]] = {task} if self.stopping is None else {task, self.stopping}
        try:
            while not task.done():
                left = deadline - _now()
                if self.stopping is not None and self.stopping.done() and not batch.on_wire(task):
                    raise _Stopping
                if left > 0:
                    await asyncio.wait(awaited, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                elif batch.on_wire(task):
                    await asyncio.wait({task}, timeout=WIRE_LOOK)
                else:
                    raise _Late
            if task.cancelled() and batch.stopped is not None:
                raise batch.stopped
            return task.result()
        finally:
            self._waiters[task] -= 1
            if not self._waiters[task]:
                del self._waiters[task]
                if not task.done() and not batch.on_wire(task):
                    task.cancel()  # late, or its client gone: its place given up, nothing committed for it

    def _answered(self, batch: OpenBatch, answer: Answer, told: _Told) -> Served:
        self.waits.answered += 1
        batch.count(answer, sent=told.started is not None)
        return Served(answer, told.error)

    def _late(self) -> Served:
        """A request whose turn did not come in time: 503 while the key's budget is out of reach, 429
        until a spent quota's reset, else 429 until its turn would come (the key's pause, then the
        requests waiting ahead of it at the key's interval, on the run's share)."""
        lanes = self.run.pieces.lanes
        now = lanes[0].pacer.now()
        if any(lane.pacer.state().budget is not None for lane in lanes):
            return _unavailable(self.waits)
        self.waits.late += 1
        spent = [lane.spent_now() for lane in lanes]
        if all(spent):
            reset = min(s.until for s in spent if s is not None) - time.time()
            what = "; ".join(s.describe() for s in spent if s is not None)
            return Served(status=LATE, retry_after=reset, why=f"the key's {what}")
        waiting = max(1, self.waits.waiting // len(lanes))
        turn = min((lane.pacer.turn_in(waiting) for lane in lanes if lane.out_until <= now), default=1.0)
        return Served(
            status=LATE, retry_after=turn, why=f"the key's next turn for it is in {turn:.1f} s, past its wait"
        )

    async def close(self) -> None:
        """Its batches drained (answers on the wire kept), its keys' last words said, its run closed;
        its report merged into ``report``."""
        try:
            for batch in self._batches.values():
                await batch.close()
            await finish_lanes(self.run.pieces.lanes)
        finally:
            await self.run.__aexit__(None, None, None)
        if self.report is not None and self.run.report is not None:
            try:
                write_report(self.report, self.run.report, shared=True)
            except OSError as exc:
                log.warning("batchsum: could not write the report %s: %s", self.report, exc)


def _unavailable(waits: Waits) -> Served:
    """A request the key's budget out of reach kept from its turn: 503, nothing sent."""
    waits.unavailable += 1
    why = "the key's rate budget cannot be reached; nothing was sent"
    return Served(status=UNAVAILABLE, retry_after=MAX_PROBE_SECONDS, why=why)


def _stopped(waits: Waits, stop: BatchsumError) -> Served:
    """A request its batch's stop ended: the key refused (the service's 401, handed on), a quota
    spent past ``max_wait`` (429 until its reset), the budget lost (503)."""
    if isinstance(stop, APIStatusError):
        waits.answered += 1
        return Served(error=stop)
    if isinstance(stop, QuotaSpent):
        waits.late += 1
        return Served(status=LATE, retry_after=stop.resets_at - time.time(), why=str(stop))
    if isinstance(stop, BudgetError):
        return _unavailable(waits)
    waits.unavailable += 1
    return Served(status=UNAVAILABLE, retry_after=MAX_PROBE_SECONDS, why=str(stop))


class KeyRuns:
    """``ServedRun``s by key, on one event loop: a key's opened on its first request from
    ``spec_for(key)``, closed once idle ``idle_seconds`` (``kept``, a key never closed: the held
    keys'), every one at ``close``. A run older than ``RENEW_SECONDS`` is renewed: the next request
    opens the key's next run, and the old one closes once its last request is answered (so what a
    run keeps as it goes stays a day's). ``report``: where each merges its run report. ``live``: the
    part of the key their requests may take ahead of the batch runs' reserved starts."""

    def __init__(
        self,
        spec_for: Callable[[str], RunSpec],
        *,
        idle_seconds: float = IDLE_SECONDS,
        report: str | None = None,
        kept: str | None = None,
        live: float = 0.0,
    ) -> None:
        self.spec_for, self.idle_seconds, self.report, self.kept = spec_for, idle_seconds, report, kept
        self.live = live
        self._runs: dict[str, ServedRun] = {}
        self._old: list[ServedRun] = []  # renewed: closed once idle
        self._opening: dict[str, asyncio.Task[ServedRun]] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._stopping: asyncio.Future[None] | None = None

    async def get(self, key: str) -> ServedRun:
        """The key's run, opened on its first request (what opening raises: its budget unusable)."""
        run = self._runs.get(key)
        if run is not None:
            return run
        opening = self._opening.get(key)
        if opening is None:
            opening = self._opening[key] = asyncio.ensure_future(self._open(key))
            opening.add_done_callback(lambda _: self._opening.pop(key, None))
        return await asyncio.shield(opening)

    async def _open(self, key: str) -> ServedRun:
        run = await ServedRun(self.spec_for(key), self.report, self._stopping, self.live).open()
        self._runs[key] = run  # kept even when every request that asked for it has gone
        return run

    def start(self) -> None:
        """The watch for idle keys, and the kept key's run opened now (a failure said in one line:
        its first request tries again)."""
        self._stopping = asyncio.get_running_loop().create_future()
        self._reaper = asyncio.ensure_future(self._reap())
        if self.kept is not None:
            asyncio.ensure_future(self.get(self.kept)).add_done_callback(_said)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(min(self.idle_seconds / 4, 30.0))
            now = time.monotonic()
            for key, run in list(self._runs.items()):
                if now - run.opened > RENEW_SECONDS:
                    del self._runs[key]
                    self._old.append(run)
                elif key != self.kept and not run.busy and now - run.used > self.idle_seconds:
                    del self._runs[key]
                    self._old.append(run)
            for run in [run for run in self._old if not run.busy]:
                self._old.remove(run)
                await _close(run)

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn now, every key's."""
        return sum(run.waits.waiting for run in self._runs.values())

    def stop(self) -> None:
        """The door stops (from any thread): every request waiting for its turn is answered now
        (a 503 with Retry-After, nothing sent), those on the wire get their answers."""
        stopping = self._stopping
        if stopping is not None:
            stopping.get_loop().call_soon_threadsafe(_resolve, stopping)

    async def close(self) -> None:
        """Every key's run closed (answers on the wire kept, their entries gone from ``top``)."""
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        await asyncio.gather(*self._opening.values(), return_exceptions=True)
        runs, self._runs, self._old = [*self._runs.values(), *self._old], {}, []
        for run in runs:
            await _close(run)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _close(run: ServedRun) -> None:
    try:
        await run.close()
    except Exception:  # noqa: BLE001 - one key's close never keeps the others open, nor stops the gateway
        log.warning("batchsum: a key's run did not close cleanly", exc_info=True)


def _said(task: asyncio.Future[Any]) -> None:
    """A kept run's first opening, if it failed, said in one line (the next request tries again)."""
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("batchsum: the key's run could not be opened yet: %s", error)
