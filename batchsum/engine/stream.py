"""The async batch engine: texts in, one result per row out, in input order.

Each row is pre-filtered with the contract (never sent when the service would refuse it), looked up
by request fingerprint in the answer store (an earlier run's journal, this run's answers), joined to
an identical request already under way, or sent through the pacer. At most ``concurrency`` requests
are in flight and at most ``window`` rows wait between reading and yielding, whatever the input size.
The first 401 stops the batch: nothing more is sent, and the error is raised after the rows already
finished are yielded; their answers stay in the store. So does a rate budget that cannot be reached
for longer than ``budget_wait`` (``BudgetError``; a shorter outage is a pause): without it, no process
could know what the others send.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from contextlib import aclosing
from typing import Any

from ..data.results import BLOCK_ROWS, Answer, RowBlock, RowResult
from ..data.stores import AnswerStore, MemoryStore
from ..pacing import Pacer
from ..service import contract
from ..service.client import AsyncClient, validate_params
from ..service.errors import BrokenInputError, RequestCapReached
from ._batch import Batch
from ._stop import NOT_SENT
from ._window import Known, Pending, Window, as_row
from .fingerprints import fingerprint as fingerprint
from .fingerprints import text_fingerprint as text_fingerprint
from .lanes import KeyLane, Pacers, finish_lanes
from .options import RunOptions as RunOptions
from .plan import BatchPlan as BatchPlan
from .plan import plan_batch as plan_batch
from .tally import BatchStats
from .timeline import Timeline

__all__ = [
    "RunOptions",
    "RowBlock",
    "fingerprint",
    "summarize_stream",
    "stream_results",
    "rows_of",
    "BatchPlan",
    "plan_batch",
]

log = logging.getLogger("batchsum")
YIELD_EVERY = 256  # rows between turns given to the event loop when none of them had to wait


async def _rows(texts: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    if isinstance(texts, AsyncIterable):
        async for text in texts:
            yield text
    else:
        for text in texts:
            yield text


class _Tally:
    """Counts each row when its result is known, not when it is yielded: results are yielded in
    input order, and a row held back by a retry must not hide the answers arriving behind it."""

    __slots__ = ("stats", "on_result", "_settled")

    def __init__(self, stats: BatchStats, on_result: Callable[[BatchStats], None] | None) -> None:
        self.stats = stats
        self.on_result = on_result
        # Rows a stop gave a record their task never had, by task (rows with the same text share one).
        self._settled: Counter[asyncio.Task[Any]] = Counter()

    def add(self, item: Pending | Known) -> None:
        if isinstance(item, asyncio.Task):
            item.add_done_callback(self._finished)
        elif isinstance(item, list):
            self.stats.count_many(item)
            if self.on_result is not None:
                self.on_result(self.stats)
        else:
            self._count(as_row(item))

    def settle(self, item: Pending, result: RowResult) -> None:
        """``result`` is the row's record, given by a stop (``not_sent``) when its task gave none."""
        if isinstance(item, asyncio.Task) and not (item.done() and not item.cancelled() and item.exception() is None):
            if not item.done():  # its callback for this row is still to come: it must not count it again
                self._settled[item] += 1
            self._count(result)

    def _finished(self, task: asyncio.Task[Answer] | asyncio.Task[RowResult]) -> None:
        if self._settled[task] > 0:
            self._settled[task] -= 1
            if not self._settled[task]:
                del self._settled[task]
            return
        if not task.cancelled() and task.exception() is None:
            self._count(as_row(task.result()))

    def _count(self, result: RowResult) -> None:
        self.stats.count(result)
        if self.on_result is not None:
            self.on_result(self.stats)


async def summarize_stream(
    texts: Iterable[Any] | AsyncIterable[Any],
    client: AsyncClient,
    params: contract.Params | None = None,
    options: RunOptions | None = None,
    *,
    store: AnswerStore | None = None,
    stats: BatchStats | None = None,
    pacer: Pacer | None = None,
    on_result: Callable[[BatchStats], None] | None = None,
    lanes: Sequence[KeyLane] | None = None,
    **settings: Any,
) -> AsyncIterator[RowResult]:
    """Yield one ``RowResult`` per text, in input order.

    ``texts``: the rows (a list is taken ``BLOCK_ROWS`` at a time, each block looked up in bulk), or
    ``RowBlock`` items of rows read together. ``params`` (``contract.Params``) and ``options``
    (``RunOptions``) say what to ask and how to run; for short calls their fields may be given as
    keywords instead (``mode``, ``percentage``, ``type``; ``rpm``, ``concurrency``, ``limiter``,
    ``budget``, ``budget_wait``, ``window``, ``drain_seconds``, ...: ``RunOptions.of`` checks them). ``store`` keeps finished answers (default: in memory for this
    call); ``stats`` is updated live and ``on_result`` called as each row's result arrives (results
    are yielded in order; counts are not held back). ``lanes``: several keys (``keys.KeyLane``), the
    requests spread over them (``client`` and ``pacer`` then unused). Raises ``InvalidParameterError`` for bad
    settings before reading any row; ``AuthenticationError`` / ``NotPremiumError`` when the service
    refuses the key or the plan, and ``JournalError`` when the store cannot keep an answer, after
    yielding the rows already finished.
    """
    results = stream_results(
        texts,
        client,
        params,
        options,
        store=store,
        stats=stats,
        pacer=pacer,
        on_result=on_result,
        lanes=lanes,
        **settings,
    )
    async for result in rows_of(results):
        yield result


async def rows_of(results: AsyncGenerator[RowResult | Known, None]) -> AsyncIterator[RowResult]:
    """``stream_results``' items one row at a time (a run of known rows taken apart); closes it."""
    async with aclosing(results):
        async for item in results:
            if isinstance(item, list):
                for result in item:
                    yield result
            else:
                yield item


async def stream_results(
    texts: Iterable[Any] | AsyncIterable[Any],
    client: AsyncClient,
    params: contract.Params | None = None,
    options: RunOptions | None = None,
    *,
    store: AnswerStore | None = None,
    stats: BatchStats | None = None,
    pacer: Pacer | None = None,
    on_result: Callable[[BatchStats], None] | None = None,
    lanes: Sequence[KeyLane] | None = None,
    **settings: Any,
) -> AsyncGenerator[RowResult | Known, None]:
    """``summarize_stream``'s results as they are held: a row's ``RowResult``, or a list of the
    results of consecutive rows that needed no request (a rerun's rows, answered by the journal in
    bulk), which a writer can take whole. ``lanes``: the run's keys (``keys.KeyLane``: a client and a
    pacer each), over which its requests are spread; without, ``client`` and ``pacer`` are its one key."""
    request_fields = {k: settings.pop(k) for k in ("mode", "percentage", "type") if k in settings}
    if params is None:
        params = validate_params(**request_fields)
    elif request_fields:
        raise TypeError("pass either params or mode/percentage/type, not both")
    if options is None:
        try:
            options = RunOptions.of(**settings)
        except TypeError as exc:
            raise TypeError(f"summarize_stream: {exc}") from None
    elif settings:
        raise TypeError(f"pass either options or {', '.join(settings)}, not both")
    stats = stats if stats is not None else BatchStats()
    if lanes is None:
        if pacer is None:
            stats.timeline = stats.timeline or Timeline(options.rpm)
            pacer = options.pacer(log=stats.timeline)
        lanes = [KeyLane(client, pacer, options.record, budget=options.budget)]
    for lane in lanes:  # a budget out of reach mid-run is waited for this long, then the batch stops
        if lane.budget is not None:
            lane.budget.outage.arm(options.budget_wait)
    stats.pacer = lanes[0].pacer if len(lanes) == 1 else Pacers(lanes)
    batch = Batch(list(lanes), params, options, store if store is not None else MemoryStore(), stats)
    window = Window(options.window, options.window_bytes)
    rows = _rows(_blocks(texts))
    exhausted = False
    stop_waiter = asyncio.ensure_future(batch.halt.stopped.wait())
    tally = _Tally(stats, on_result)
    since_turn = 0
    try:
        while True:
            while not exhausted and (batch.halt.read_on or not batch.halt.stopped.is_set()) and window.has_room():
                try:
                    read = await rows.__anext__()
                except StopAsyncIteration:
                    exhausted = True
                    break
                except BrokenInputError as exc:  # every row read so far still gets its record
                    batch.stop(exc, unsent_rows=True)
                    exhausted = True
                    break
                if isinstance(read, RowBlock):
                    items = await batch.intake.submit_block(read.texts)
                    each = read.nbytes // max(1, len(read.texts))
                    for item in items:
                        count = len(item) if isinstance(item, list) else 1
                        window.add(item, count, each * count)
                        tally.add(item)
                else:
                    item = batch.intake.submit(read)
                    window.add(item, 1, len(read) if type(read) is str else 0)
                    tally.add(item)
            if not window.items:
                if isinstance(batch.halt.fatal, RequestCapReached):
                    batch.halt.fatal.with_remaining(stats.failed_by_code[NOT_SENT])
                if batch.halt.fatal is not None:
                    raise batch.halt.fatal
                break
            head = window.items[0]
            if isinstance(head, list):
                window.pop()
                stats.yielded += len(head)
                since_turn += len(head)
                out: RowResult | Known = head
            else:
                out = await batch.halt.next_result(head, stop_waiter)
                tally.settle(window.pop(), out)  # type: ignore[arg-type]
                stats.yielded += 1
                since_turn += 1
            if since_turn >= YIELD_EVERY:
                since_turn = 0
                await asyncio.sleep(0)  # rows answered by the store never wait: let a stop (a signal) in
            yield out
    finally:
        stop_waiter.cancel()
        await batch.close(window.items)
        await asyncio.gather(stop_waiter, return_exceptions=True)
        await finish_lanes(lanes)
        await rows.aclose()  # type: ignore[attr-defined]  # closes the input (an open file) on an early stop too


def _blocks(texts: Iterable[Any] | AsyncIterable[Any]) -> Iterable[Any] | AsyncIterable[Any]:
    """A list or tuple of rows as ``RowBlock``s of ``BLOCK_ROWS``; any other input as it comes (a
    generator's rows are not waited for in blocks)."""
    if not isinstance(texts, (list, tuple)):
        return texts
    rows = texts
    return (
        RowBlock(list(rows[i : i + BLOCK_ROWS]), sum(len(t) for t in rows[i : i + BLOCK_ROWS] if type(t) is str))
        for i in range(0, len(rows), BLOCK_ROWS)
    )
