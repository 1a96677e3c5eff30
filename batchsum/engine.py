"""The async batch engine: texts in, one result per row out, in input order.

Each row is pre-filtered with the contract (never sent when the service would refuse it), looked up
by request fingerprint in the answer store (an earlier run's journal, this run's answers), joined to
an identical request already under way, or sent through the pacer. At most ``concurrency`` requests
are in flight and at most ``window`` rows wait between reading and yielding, whatever the input size.
The first 401 stops the batch: nothing more is sent, and the error is raised after the rows already
finished are yielded; their answers stay in the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from . import contract
from .client import AsyncClient, PreparedRequest, validate_params
from .errors import (
    APIError,
    APIStatusError,
    AuthenticationError,
    InvalidParameterError,
    NotPremiumError,
    UnprocessableEntityError,
)
from .pacing import Pacer

__all__ = [
    "RowResult",
    "Answer",
    "AnswerStore",
    "MemoryStore",
    "BatchStats",
    "fingerprint",
    "summarize_stream",
    "result_columns",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_WINDOW",
]

DEFAULT_CONCURRENCY = 16
DEFAULT_WINDOW = 1024
DEFAULT_DRAIN_SECONDS = 15.0

log = logging.getLogger("batchsum")

OK = "ok"
SKIPPED = "skipped"
FAILED = "failed"


class RowResult(NamedTuple):
    """The result of one input row."""

    summary: str | None
    status: str  # "ok" | "skipped" | "failed"
    error: str | None  # None, a skip reason, or an error code (errors.APIError.code)
    message: str | None  # the service's words, or ours
    http_status: int | None
    attempts: int


def result_columns(output_column: str = "summary") -> list[str]:
    """Column names of a ``RowResult``, named after the output column."""
    return [output_column] + [f"{output_column}_{name}" for name in RowResult._fields[1:]]


Answer = RowResult  # what the store keeps per fingerprint: an "ok" or a permanent "failed" result


def fingerprint(request: PreparedRequest) -> str:
    """The request's identity: text, mode, percentage and type. Identical requests share one answer."""
    payload = json.dumps(request.fields(), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class AnswerStore(Protocol):
    """Where finished answers are kept by fingerprint (``MemoryStore``, ``journal.Journal``)."""

    def get(self, key: str) -> Answer | None: ...

    def put(self, key: str, answer: Answer) -> None: ...


class MemoryStore:
    """An in-process answer store (a dict)."""

    def __init__(self) -> None:
        self._answers: dict[str, Answer] = {}

    def get(self, key: str) -> Answer | None:
        return self._answers.get(key)

    def put(self, key: str, answer: Answer) -> None:
        self._answers[key] = answer

    def __len__(self) -> int:
        return len(self._answers)


def is_permanent(answer: Answer) -> bool:
    """Worth keeping across runs: a summary, or a refusal that would be repeated (422)."""
    return answer.status == OK or answer.error == UnprocessableEntityError.code


@dataclass
class BatchStats:
    """Live counts of a batch, read by progress bars and the final account."""

    total: int | None = None
    done: int = 0
    ok: int = 0
    skipped: int = 0
    failed: int = 0
    sent: int = 0  # requests that went to the service (each may take several attempts)
    attempts: int = 0
    reused: int = 0  # rows answered from the store or by an identical request of this run
    skipped_by_reason: Counter[str] = field(default_factory=Counter)
    failed_by_code: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    pacer: Pacer | None = None

    @property
    def rate_limited(self) -> int:
        return self.pacer.rate_limited if self.pacer else 0

    @property
    def pace(self) -> float:
        return self.pacer.pace if self.pacer else 0.0

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def count(self, result: RowResult) -> None:
        self.done += 1
        if result.status == OK:
            self.ok += 1
        elif result.status == SKIPPED:
            self.skipped += 1
            self.skipped_by_reason[result.error or "?"] += 1
        else:
            self.failed += 1
            self.failed_by_code[result.error or "?"] += 1

    def account(self) -> str:
        """One line: rows, sent, reused, skipped by reason, failed by code, 429s, wall time."""
        def by(counter: Counter[str]) -> str:
            return " (" + ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) + ")" if counter else ""

        return (
            f"{self.done} rows: {self.ok} ok, {self.skipped} skipped{by(self.skipped_by_reason)}, "
            f"{self.failed} failed{by(self.failed_by_code)}; {self.sent} sent, {self.reused} reused, "
            f"{self.rate_limited} 429s, {self.elapsed:.1f}s"
        )


class _Gate:
    """The pacer as the client's attempt hooks, plus what the engine must know when it stops:
    which tasks have a request on the wire, and that no new attempt may start."""

    __slots__ = ("pacer", "closing", "on_wire")

    def __init__(self, pacer: Pacer) -> None:
        self.pacer = pacer
        self.closing = False
        self.on_wire: set[asyncio.Task[Any]] = set()

    async def before_attempt(self) -> float:
        if self.closing:
            raise asyncio.CancelledError
        started = await self.pacer.before_attempt()
        if self.closing:
            raise asyncio.CancelledError
        task = asyncio.current_task()
        if task is not None:
            self.on_wire.add(task)
        return started

    def after_rate_limit(self, started_at: float, retry_after: float | None) -> None:
        self.pacer.after_rate_limit(started_at, retry_after)


def _failure(error: APIError) -> Answer:
    status = error.status_code if isinstance(error, APIStatusError) else None
    return Answer(None, FAILED, error.code, error.message, status, error.attempts)


async def _rows(texts: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    if isinstance(texts, AsyncIterable):
        async for text in texts:
            yield text
    else:
        for text in texts:
            yield text


async def summarize_stream(
    texts: Iterable[Any] | AsyncIterable[Any],
    client: AsyncClient,
    *,
    mode: Any = contract.Mode.STANDARD,
    percentage: Any = contract.PERCENTAGE_DEFAULT,
    type: Any = None,
    rpm: float = 0,
    concurrency: int = DEFAULT_CONCURRENCY,
    store: AnswerStore | None = None,
    stats: BatchStats | None = None,
    pacer: Pacer | None = None,
    window: int = DEFAULT_WINDOW,
    on_result: Callable[[BatchStats], None] | None = None,
    drain_seconds: float = DEFAULT_DRAIN_SECONDS,
) -> AsyncIterator[RowResult]:
    """Yield one ``RowResult`` per text, in input order.

    ``rpm`` paces request starts (0 = no pacing); ``store`` keeps finished answers (default: in
    memory for this call); ``stats`` is updated live and ``on_result`` called after every row.
    Raises ``InvalidParameterError`` for bad parameters before reading any row, and
    ``AuthenticationError`` / ``NotPremiumError`` when the service refuses the key or the plan.
    """
    params = validate_params(mode, percentage, type)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidParameterError(f"invalid concurrency {concurrency!r}: use a whole number >= 1")
    store = store if store is not None else MemoryStore()
    pacer = pacer if pacer is not None else Pacer(rpm)
    stats = stats if stats is not None else BatchStats()
    stats.pacer = pacer
    slots = asyncio.Semaphore(concurrency)
    under_way: dict[str, asyncio.Task[Answer]] = {}
    stopped = asyncio.Event()
    fatal: list[APIError] = []

    gate = _Gate(pacer)
    # The first request goes alone: a wrong key or an expired plan costs one request, not `concurrency`.
    first_answered = asyncio.Event()
    first_sent = False

    async def fetch(key: str, request: PreparedRequest) -> Answer:
        nonlocal first_sent
        is_first = not first_sent
        first_sent = True
        if not is_first:
            await first_answered.wait()
        try:
            async with slots:
                if stopped.is_set():
                    raise asyncio.CancelledError
                try:
                    summary, attempts = await client.send(request, hooks=gate)
                    answer = Answer(summary, OK, None, None, 200, attempts)
                except (AuthenticationError, NotPremiumError) as exc:
                    stats.sent += 1
                    fatal.append(exc)
                    stopped.set()
                    raise
                except APIError as exc:
                    answer = _failure(exc)
                stats.sent += 1  # counted once it reached the service, not while it waited its turn
                stats.attempts += answer.attempts
        finally:
            gate.on_wire.discard(asyncio.current_task())
            if is_first:
                first_answered.set()
        if is_permanent(answer):
            store.put(key, answer)
        return answer

    def submit(text: Any) -> RowResult | asyncio.Task[Answer]:
        problem = contract.text_problem(text)
        if problem is not None:
            reason, message = problem
            return RowResult(None, SKIPPED, reason.value, message, None, 0)
        request = PreparedRequest(text, params)
        key = fingerprint(request)
        task = under_way.get(key)
        if task is not None:
            stats.reused += 1
            return task
        known = store.get(key)
        if known is not None:
            stats.reused += 1
            return known
        task = asyncio.ensure_future(fetch(key, request))
        under_way[key] = task
        task.add_done_callback(lambda _: under_way.pop(key, None))
        return task

    pending: deque[RowResult | asyncio.Task[Answer]] = deque()
    rows = _rows(texts)
    exhausted = False
    stop_waiter = asyncio.ensure_future(stopped.wait())
    try:
        while True:
            while not exhausted and not stopped.is_set() and len(pending) < window:
                try:
                    text = await rows.__anext__()
                except StopAsyncIteration:
                    exhausted = True
                    break
                pending.append(submit(text))
            if not pending:
                break
            head = pending[0]
            if isinstance(head, asyncio.Task):
                if not head.done():
                    await asyncio.wait({head, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
                if fatal:
                    raise fatal[0]
                result = head.result()
            else:
                result = head
            pending.popleft()
            stats.count(result)
            if on_result is not None:
                on_result(stats)
            yield result
    finally:
        # Start nothing new; let requests already on the wire finish (the service will charge for
        # them) and keep their answers; then cancel the rest. A second Ctrl-C aborts at once.
        gate.closing = True
        stop_waiter.cancel()
        tasks = {item for item in pending if isinstance(item, asyncio.Task)} | set(under_way.values())
        for task in tasks - gate.on_wire:
            task.cancel()
        on_wire = [task for task in tasks & gate.on_wire if not task.done()]
        if on_wire and not fatal:
            log.info("waiting up to %gs for %d requests on the wire", drain_seconds, len(on_wire))
            await asyncio.wait(on_wire, timeout=drain_seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, stop_waiter, return_exceptions=True)
        await rows.aclose()  # closes the input (an open Parquet file) on an early stop too



@dataclass
class BatchPlan:
    """What a run would do, without sending anything (``--dry-run``)."""

    rows: int = 0
    to_send: int = 0  # distinct requests the store does not answer
    duplicates: int = 0  # rows that share a request with an earlier row
    known: int = 0  # rows the store already answers
    skipped_by_reason: Counter[str] = field(default_factory=Counter)

    def minimum_seconds(self, rpm: float) -> float:
        """The least time the requests can take at ``rpm`` (starts evenly spaced, the first at once)."""
        return max(0, self.to_send - 1) * 60.0 / rpm if rpm else 0.0

    def describe(self, rpm: float) -> str:
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped_by_reason.items())) or "none"
        pace = (
            f"at {rpm:g} requests/min that takes at least {_duration(self.minimum_seconds(rpm))}"
            if rpm
            else "unpaced (rpm 0)"
        )
        return "\n".join(
            [
                f"rows:             {self.rows}",
                f"would send:       {self.to_send} requests; {pace}",
                f"already answered: {self.known} rows (journal)",
                f"duplicates:       {self.duplicates} rows share a request with an earlier row",
                f"would skip:       {sum(self.skipped_by_reason.values())} rows ({skipped})",
            ]
        )


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def plan_batch(
    texts: Iterable[Any],
    *,
    mode: Any = contract.Mode.STANDARD,
    percentage: Any = contract.PERCENTAGE_DEFAULT,
    type: Any = None,
    store: AnswerStore | None = None,
) -> BatchPlan:
    """Classify every row as the engine would, and send nothing."""
    params = validate_params(mode, percentage, type)
    plan = BatchPlan()
    seen: set[bytes] = set()
    for text in texts:
        plan.rows += 1
        problem = contract.text_problem(text)
        if problem is not None:
            plan.skipped_by_reason[problem[0].value] += 1
            continue
        key = fingerprint(PreparedRequest(text, params))
        digest = bytes.fromhex(key)
        if digest in seen:
            plan.duplicates += 1
            continue
        seen.add(digest)
        if store is not None and store.get(key) is not None:
            plan.known += 1
        else:
            plan.to_send += 1
    return plan
