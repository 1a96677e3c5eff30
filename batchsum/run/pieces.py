"""What a run opens and closes (``Pieces``): per key, a client, the key's budget (checked once), its
record and a pacer (``lanes``); the run's locks and output, the answer store and the progress bar."""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from ..data.journal import RunLock
from ..data.scopes import Scopes
from ..data.stores import AnswerStore
from ..engine.lanes import KeyLane, Pacers
from ..engine.options import RunOptions
from ..engine.tally import BatchStats
from ..engine.timeline import Timeline
from ..pacing import KeyRecord, PaceChange, Pacer
from ..pacing.budgets.budget import Budget, Share, open_budget
from ..service.client import AsyncClient
from ..service.errors import InvalidParameterError, JournalError
from ..service.key_plans import KeyPlan
from ..service.location import Location
from .answer_scopes import open_scopes, store_scope
from .binding import spec_key_hash
from .entry import open_entry
from .logs import event
from .progress import ProgressBar
from .spec import RunSpec

if TYPE_CHECKING:
    from ..data.datasets import DatasetOutput

__all__ = ["Pieces", "sample_rows", "SAMPLE_SEED"]

SAMPLE_SEED = 23  # the sample's rows are the same every time (and so are its answers, reused later)


def sample_rows(size: int, total: int) -> frozenset[int]:
    """``size`` row positions spread over ``total`` rows, seeded: the same every time."""
    return frozenset(random.Random(SAMPLE_SEED).sample(range(total), min(size, total)))


def _size(store: AnswerStore) -> int:
    try:
        return len(store)  # type: ignore[arg-type]
    except (TypeError, JournalError):
        return 0


class Pieces:
    """The pieces of one run, opened in order on entry and closed in reverse on exit.

    ``locks``: files the run owns while it runs (``RunLock``), ``wait``: wait for another run holding
    them. ``output``: makes the dataset output, after the locks are taken and before the journal is
    opened, so that a refused journal leaves no temporary output behind; the journal records the
    location it served. ``client``: the client each key sends with. ``live``: a live door's part of the
    key its requests may take ahead of the batch runs (the gateway's ``--interactive-share``; 0: none).
    """

    def __init__(
        self,
        locks: Sequence[tuple[str | os.PathLike[str], str]] = (),
        *,
        wait: bool = False,
        output: Callable[[], DatasetOutput] | None = None,
        client: type[AsyncClient] = AsyncClient,
        live: float = 0.0,
    ) -> None:
        self._client_type = client
        self._live = live
        self._locks = locks
        self._wait = wait
        self._make_output = output
        self.output: DatasetOutput | None = None
        self._stack = AsyncExitStack()
        self._kept = 0
        self._final: int | None = None
        self.client: AsyncClient
        self.budget: Budget
        self.record: KeyRecord
        self.store: Scopes
        self.bar: ProgressBar
        self.options: RunOptions
        self.pacer: Pacer  # the first key's (``lanes``: every key's)
        self.lanes: list[KeyLane] = []
        self._adopted: str | None = None  # what adopting a journal from before services meant

    async def open(
        self,
        spec: RunSpec,
        stats: BatchStats,
        run_id: str,
        *,
        shared: bool,
        on_pace_change: Callable[[PaceChange], None],
    ) -> None:
        """Open every piece for a run of ``spec`` (bound) counted in ``stats``; a piece that fails
        closes the ones opened before it. ``shared``: one of several runs using the answers at once."""
        stack = self._stack
        sample = None
        if spec.sample is not None:
            if stats.total is None:
                raise InvalidParameterError("sample needs the number of rows: it is spread over the whole input")
            sample = sample_rows(spec.sample, stats.total)
        try:
            plans = spec.keys or (None,)
            if len(plans) > 1 and not isinstance(spec.budget, Location):
                raise InvalidParameterError(
                    "a Budget object paces one key: with several keys, name the budget (machine, ...)"
                )
            opened = [await _open_key(self._stack, spec, plan, self._client_type) for plan in plans]
            self.client, self.budget = opened[0][0], opened[0][1]
            for path, what in self._locks:
                stack.enter_context(RunLock(path, what, wait=self._wait))
            if self._make_output is not None:
                self.output = self._make_output()
                stack.push(self._abort_output)
            records = [await KeyRecord.recall(budget, key, spec.client.service) for _, budget, key, _ in opened]
            self.record = records[0]
            scope = store_scope(spec, [key for _, _, key, _ in opened])
            self.store, self._adopted = await open_scopes(
                stack, spec, run_id, self.client.identity, self.output, shared, scope, records
            )
            self._kept = _size(self.store)
            self.bar = stack.enter_context(ProgressBar(stats.total, enabled=spec.progress))
            if self._adopted is not None:  # said once per journal (on stderr when the bar is off)
                self.bar.write(f"batchsum: {self._adopted}")
        except BaseException:
            await stack.aclose()
            raise
        self.options = _run_options(spec, self.budget, self.record, sample)
        stats.timeline = Timeline(spec.rpm)
        share = Share(run_id, spec.share) if spec.share < 1 else None
        self.lanes = []
        for (client, budget, key, plan), record in zip(opened, records):
            rpm, auto = plan.limit(spec.rpm, spec.auto) if plan is not None else (spec.rpm, spec.auto)
            options = dataclasses.replace(self.options, rpm=rpm, auto=auto, budget=budget, record=record)
            entry = open_entry(self._stack, run_id, budget, spec, stats, shared=shared, output=self.output)
            pacer = options.pacer(
                on_pace_change, share=share, alone=not shared, log=stats.timeline, presence=entry, live=self._live
            )
            quota = plan.quota if plan is not None and plan.quota is not None else spec.quota
            source = plan.source if plan is not None else ""
            lane = KeyLane(client, pacer, record, key, source, quota, budget, tell=self._tell)
            entry.attach(lane)
            self.lanes.append(lane)
        self.pacer = self.lanes[0].pacer
        _watch_keys(self.lanes, records, stats, spec.params.mode)

    def _tell(self, message: str) -> None:
        """A line about a key for a person (above the bar, or on stderr) and the JSON log."""
        event("key", message)
        self.bar.write(f"batchsum: {message}")

    def _abort_output(self, *exc_info: Any) -> None:
        """On the way out: a temporary output not committed is removed."""
        if self.output is not None:
            self.output.abort()

    def count_final(self) -> None:
        """Before the journal closes: the answers in it now, to tell what this run added to it."""
        self._final = _size(self.store)

    async def close(self) -> None:
        await self._stack.aclose()

    @property
    def new_answers(self) -> int:
        """Answers this run added to its store (the journal): what a rerun will not pay for; none
        while the store is not open yet (a signal during the budget check)."""
        if self._final is not None:
            return self._final - self._kept
        return _size(self.store) - self._kept if hasattr(self, "store") else 0


def _run_options(spec: RunSpec, budget: Budget, record: KeyRecord, sample: Any) -> RunOptions:
    """How the engine runs ``spec``'s batch (the first key's budget and record; each key's own are
    put in when its pacer is made)."""
    return RunOptions(
        rpm=spec.rpm,
        auto=spec.auto,
        concurrency=spec.concurrency,
        limiter=spec.limiter,
        budget=budget,
        window=spec.window,
        window_bytes=spec.window_bytes,
        drain_seconds=spec.drain_seconds,
        max_wait=spec.max_wait,
        budget_wait=spec.budget_wait,
        long_texts=spec.long_texts,
        max_requests=spec.max_requests,
        sample_rows=sample,
        record=record,
    )


def _watch_keys(lanes: list[KeyLane], records: list[KeyRecord], stats: BatchStats, mode: int) -> None:
    """The stats a run's keys are read by; a key whose record knows its quota spent starts out of the
    run until it resets."""
    stats.timeline = stats.timeline or Timeline(0.0)
    stats.timeline.rpm = sum(lane.pacer.ceiling for lane in lanes)  # the plan the chart draws
    stats.pacer = lanes[0].pacer if len(lanes) == 1 else Pacers(lanes)
    stats.first_request = records[0].describe(mode)
    if len(lanes) > 1:
        alone = sum(1 for record in records if record.proven(mode) is None)
        stats.first_request = f"{len(lanes)} keys: {alone} send their first request alone, all at once"
    for lane in lanes:
        spent = lane.record.quota_spent() if lane.record is not None else None
        if spent is not None:
            lane.spent = spent
            lane.out_until = lane.pacer.now() + (spent.until - time.time())


async def _open_key(
    stack: AsyncExitStack, spec: RunSpec, plan: KeyPlan | None, client_type: type[AsyncClient] = AsyncClient
) -> tuple[AsyncClient, Budget, str, KeyPlan | None]:
    """One key's client and budget (checked: an unusable budget is one line before anything is
    sent; the batch arms it with ``budget_wait``), closed with the run's pieces; and the key's hash."""
    kwargs = spec.client.client_kwargs()
    if plan is not None:
        kwargs["api_key"] = plan.key.reveal()
    client = client_type(**kwargs)
    stack.push_async_callback(client.aclose)
    budget = open_budget(spec.budget, client.identity)
    stack.push_async_callback(budget.aclose)
    await budget.check()
    return client, budget, plan.hash if plan is not None else spec_key_hash(spec), plan
