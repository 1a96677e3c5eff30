"""``Run``: one run, opened from a ``RunSpec``. It opens and closes every piece a run needs (the
local service when asked, the client, the key's budget, checked once, the answer store, the pacer,
the progress bar) and streams rows through the engine; front-ends never open these themselves.

    async with Run(spec, total=len(texts)) as run:
        results = [result async for result in run.stream(texts)]
    run.stats.account()

Also here: what a front-end needs around a run and nothing more: ``bind`` (the local service
started and its address filled in), ``prepare_shared`` (a spec every Dask or Spark worker can open:
budget checked, answers shared), ``summarize_texts`` (a list in, a list out), ``write_dataset``
(an Arrow dataset streamed to a file) and ``dry_run`` (what a run would do, sending nothing).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator, Sequence, Sized
from contextlib import AsyncExitStack, ExitStack
from typing import TYPE_CHECKING, Any

from ..data.journal import Journal, RedisStore, RunLock, SharedJournal
from ..data.results import RowBlock, RowResult
from ..data.stores import AnswerStore, process_cache, shared_memory
from ..engine.stream import RunOptions, plan_batch, rows_of, stream_results
from ..pacing import KeyRecord, PaceChange
from ..pacing.budget import Budget, ProcessBudget, RedisBudget, Share, SQLiteBudget, check_budget, open_budget
from ..service import contract
from ..service.client import AsyncClient
from ..service.errors import (
    BrokenInputError,
    BudgetError,
    ConfigurationError,
    InvalidParameterError,
    JournalError,
    RequestCapReached,
    redact_location,
)
from ..service.retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from .logs import event
from .progress import ProgressBar
from .report import BatchStats, Timeline, merge_reports, run_report
from .spec import AUTO_MAX_RPM, DEFAULT_MAX_WAIT, RunSpec, Secret, document_options
from .telemetry import Metrics

if TYPE_CHECKING:
    import pyarrow as pa

    from ..data.datasets import DatasetInput, DatasetOutput
    from ..local import LocalService

__all__ = ["Run", "Workers", "bind", "prepare_shared", "summarize_texts", "run_texts", "dry_run", "local_service"]

log = logging.getLogger("batchsum")

SAMPLE_SEED = 23  # the sample's rows are the same every time (and so are its answers, reused later)
PROGRESS_SECONDS = 10.0  # between two progress events
WATCH_SECONDS = 0.25  # how often the run looks for a pause starting or ending


def sample_rows(size: int, total: int) -> frozenset[int]:
    """``size`` row positions spread over ``total`` rows, seeded: the same every time."""
    return frozenset(random.Random(SAMPLE_SEED).sample(range(total), min(size, total)))


_services: dict[int, LocalService] = {}
_services_lock = threading.Lock()


def local_service(rpm: float = 0) -> LocalService:
    """The process-wide local reference service with a per-key limit of ``rpm`` (0: none), started on
    first use; its key is fresh, so no other run shares its budget."""
    limit = int(rpm)
    with _services_lock:
        service = _services.get(limit)
        if service is None:
            try:
                from ..local import LocalService
            except ImportError as exc:
                raise ConfigurationError(str(exc)) from None
            service = _services[limit] = LocalService(rpm=limit).start()
        return service


def bind(spec: RunSpec) -> RunSpec:
    """``spec`` with the local service started and its address and key filled in (when it asks for it)."""
    if not spec.client.local or spec.client.api_key is not None:
        return spec
    service = local_service(spec.rpm)
    client = dataclasses.replace(spec.client, api_key=Secret(service.key), base_url=service.url)
    return spec.replace(client=client)


def _key_hash(spec: RunSpec) -> str:
    key_hash = spec.client.key_hash
    assert key_hash is not None, "bind() fills in the local service's key"
    return key_hash


def _identity(spec: RunSpec) -> str:
    """The key's identity at its service (a hash), as ``AsyncClient.identity`` computes it."""
    from ..service.client import Client

    with Client(**spec.client.client_kwargs()) as client:
        return client.identity


@dataclasses.dataclass(frozen=True)
class Workers:
    """Who sends for a distributed door: how many processes, on how many hosts, and ``described``
    in the door's own words ("this Dask cluster runs partitions in 2 worker processes")."""

    processes: int
    hosts: int
    described: str


def _refuse_unshared(budget: Budget, spec: str, workers: Workers) -> None:
    """One rule for every distributed door: a budget the workers cannot share is refused, with what
    to pass instead (a process budget when more than one process sends, a machine budget when they
    are on more than one host)."""
    if isinstance(budget, ProcessBudget) and (workers.processes > 1 or workers.hosts > 1):
        raise BudgetError(
            f"budget {spec!r} paces each process alone, and {workers.described}: together they would send that many "
            "times your plan's rate. Pass budget='machine' (workers on this machine) or budget='redis://HOST:PORT/DB' "
            "(workers on several machines)"
        )
    if isinstance(budget, SQLiteBudget) and workers.hosts > 1:
        raise BudgetError(
            f"budget {spec!r} is shared only by the processes of one machine, and the workers are on "
            f"{workers.hosts} hosts: pass budget='redis://HOST:PORT/DB'"
        )


def prepare_shared(spec: RunSpec, workers: Callable[[], Workers | None] | None = None) -> RunSpec:
    """A spec that many workers can open at once (Dask partitions, Spark tasks, Ray actors), checked
    here, once, before anything is sent: the local service started, the budget reachable and one the
    ``workers`` can share (asked after the budget answered; None: this process alone), the machine
    budget named by its file (the same on every worker, whatever their cache folder), and the shared
    journal created."""
    from .background import run_in_worker

    spec = bind(spec)
    identity = _identity(spec)
    budget = open_budget(spec.budget, identity)
    run_in_worker(lambda: check_budget(budget))
    who = workers() if workers is not None else None
    if who is not None:
        _refuse_unshared(budget, redact_location(spec.budget) if isinstance(spec.budget, str) else repr(budget), who)
    changes: dict[str, Any] = {"run_id": spec.run_id or uuid.uuid4().hex[:16]}  # one share for all the workers
    if isinstance(budget, SQLiteBudget):
        changes["budget"] = f"sqlite://{budget.path}"
        if spec.journal is None:
            changes["journal"] = str(budget.path.with_name(f"answers-{identity[:16]}.sqlite"))
    journal = changes.get("journal", spec.journal)
    if journal is not None:
        SharedJournal(journal).close()  # created here, once, before the workers open it
    return spec.replace(**changes)


class Run:
    """One run of ``spec``, an async context manager: the pieces open on entry, close on exit.

    ``total``: rows expected (the bar's length). ``shared``: several runs use the answers at once
    (Dask partitions, Spark tasks): claims, and the budget's store. ``stats``: counts to update live
    (a front-end that draws them, such as the app, passes its own). ``on_result``: called with the
    stats after each row. ``locks``: files this run owns while it runs (``RunLock``), ``wait``: wait
    for another run holding them. ``output``: makes the dataset output (``write_dataset``), after the
    locks are taken and before the journal is opened, so that a refused journal leaves no temporary
    output behind; the journal records the location it served.
    """

    def __init__(
        self,
        spec: RunSpec,
        *,
        total: int | None = None,
        shared: bool = False,
        stats: BatchStats | None = None,
        on_result: Callable[[BatchStats], None] | None = None,
        locks: Sequence[tuple[str | os.PathLike[str], str]] = (),
        wait: bool = False,
        output: Callable[[], DatasetOutput] | None = None,
    ) -> None:
        self.spec = spec
        self.shared = shared
        self.stats = stats if stats is not None else BatchStats()
        if total is not None:
            self.stats.total = total
        self._on_result = on_result
        self._locks = locks
        self._wait = wait
        self._make_output = output
        self.output: DatasetOutput | None = None
        self.opened = False
        self.late_stop: BaseException | None = None  # a stop that came after every row was done
        self._stack = AsyncExitStack()
        self._kept = 0
        self._final: int | None = None
        self._ticker: asyncio.Future[None] | None = None
        self._watcher: asyncio.Future[None] | None = None
        self.run_id = spec.run_id or uuid.uuid4().hex[:16]
        self.started_at = time.time()
        self.report: dict[str, Any] | None = None  # the run report, once the run has ended
        self.client: AsyncClient
        self.budget: Budget
        self.store: AnswerStore
        self.bar: ProgressBar
        self._adopted: str | None = None  # what adopting a journal from before services meant
        self._metrics: Metrics | None = None

    async def __aenter__(self) -> Run:
        spec = self.spec = bind(self.spec)
        stack = self._stack
        self.started_at = time.time()
        sample = None
        if spec.sample is not None:
            if self.stats.total is None:
                raise InvalidParameterError("sample needs the number of rows: it is spread over the whole input")
            sample = sample_rows(spec.sample, self.stats.total)
        try:
            self.client = AsyncClient(**spec.client.client_kwargs())
            stack.push_async_callback(self.client.aclose)
            self.budget = open_budget(spec.budget, self.client.identity)
            stack.push_async_callback(self.budget.aclose)
            await self.budget.check()  # an unreachable or unusable budget: one line, before anything is sent
            for path, what in self._locks:
                stack.enter_context(RunLock(path, what, wait=self._wait))
            if self._make_output is not None:
                self.output = self._make_output()
                stack.push(self._abort_output)
            self.record = await KeyRecord.recall(self.budget, _key_hash(spec), spec.client.service)
            self.store = self._open_store(self.client.identity)
            self._kept = _size(self.store)
            self.bar = stack.enter_context(ProgressBar(self.stats.total, enabled=spec.progress))
            if self._adopted is not None:  # said once per journal (on stderr when the bar is off)
                self.bar.write(f"batchsum: {self._adopted}")
        except BaseException:
            await stack.aclose()
            raise
        self.options = RunOptions(
            rpm=spec.rpm,
            auto=spec.auto,
            concurrency=spec.concurrency,
            limiter=spec.limiter,
            budget=self.budget,
            window=spec.window,
            window_bytes=spec.window_bytes,
            drain_seconds=spec.drain_seconds,
            max_wait=spec.max_wait,
            long_texts=spec.long_texts,
            max_requests=spec.max_requests,
            sample_rows=sample,
            record=self.record,
        )
        self.stats.timeline = Timeline(spec.rpm)
        self.pacer = self.options.pacer(
            self._pace_changed,
            share=Share(self.run_id, spec.share) if spec.share < 1 else None,
            alone=not self.shared,
            log=self.stats.timeline,
        )
        if spec.auto:  # the plan the chart draws: the limit in force as the run starts
            self.stats.timeline.rpm = self.pacer.ceiling
        self.stats.pacer = self.pacer
        self.stats.first_request = self.record.describe(spec.params.mode)
        pacer = self.pacer
        self.stats.telemetry = self._metrics = Metrics.open(self.run_id, lambda: pacer.pace, _version())
        if spec.progress:
            self._ticker = asyncio.ensure_future(self.bar.follow(self.stats))
        self._watcher = asyncio.ensure_future(self._watch())
        self.opened = True
        event(
            "start",
            f"run {self.run_id} started: {self.stats.total if self.stats.total is not None else 'unknown'} rows",
            run_id=self.run_id,
            total=self.stats.total,
            options=spec.describe(),
        )
        return self

    def _abort_output(self, *exc_info: Any) -> None:
        """On the way out: a temporary output not committed is removed."""
        if self.output is not None:
            self.output.abort()

    async def __aexit__(self, *exc_info: Any) -> None:
        self._final = _size(self.store)  # before the journal closes: what this run added to it
        for task in (self._ticker, self._watcher):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        try:
            await self._stack.aclose()
        finally:
            self._end(exc_info[1] if exc_info[1] is not None else self.late_stop)

    def _end(self, error: BaseException | None) -> None:
        """The run has ended, however: its report (and file), the stop or error event, the end event."""
        stats = self.stats
        if self._metrics is not None:
            self._metrics.close()
        if isinstance(error, GeneratorExit):
            error = None
        self.report = run_report(
            stats,
            run_id=self.run_id,
            options=self.spec.describe(),
            started_at=self.started_at,
            ended_at=time.time(),
            error=error,
        )
        if self.spec.report is not None:
            try:
                write_report(self.spec.report, self.report, shared=self.shared)
            except OSError as exc:
                log.warning("could not write the run report %s: %s", self.spec.report, exc)
        if error is not None:
            kind = "stop" if self.report["outcome"] == "stopped" else "error"
            event(
                kind,
                f"run {self.run_id} {'stopped' if kind == 'stop' else 'failed'}: {self.report['error']['message']}",
                run_id=self.run_id,
                error=self.report["error"],
            )
        event(
            "end",
            f"run {self.run_id} ended ({self.report['outcome']}): {stats.account()}",
            run_id=self.run_id,
            outcome=self.report["outcome"],
            rows=self.report["rows"],
            requests={k: v for k, v in self.report["requests"].items() if k != "by_outcome"},
            seconds=self.report["seconds"],
        )

    async def _watch(self) -> None:
        """Events a scheduler follows while the run goes: a pause starting and ending, progress."""
        paused = False
        last_progress = time.monotonic()
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            state = self.stats.pacer_state()
            if state is not None and (state.paused_for > 0) != paused:
                paused = not paused
                if paused:
                    event(
                        "pause",
                        f"paused {state.paused_for:.1f} s: {state.pause_reason}",
                        run_id=self.run_id,
                        seconds=round(state.paused_for, 3),
                        reason=state.pause_reason,
                    )
                else:
                    event("resume", "resumed", run_id=self.run_id)
            if time.monotonic() - last_progress >= PROGRESS_SECONDS:
                last_progress = time.monotonic()
                self._progress()

    def _progress(self) -> None:
        stats = self.stats
        event(
            "progress",
            f"{stats.done}/{stats.total if stats.total is not None else '?'} rows; {stats.paid} paid requests",
            run_id=self.run_id,
            done=stats.done,
            total=stats.total,
            ok=stats.ok,
            skipped=stats.skipped,
            failed=stats.failed,
            paid=stats.paid,
            rate_limited=stats.outcomes["rate_limited"],
            pace=round(self.pacer.pace, 3),
            in_flight=self.pacer.in_flight.on_wire,
        )

    def _open_store(self, identity: str) -> AnswerStore:
        """The journal when the spec names one; else this process's answers (one run at a time) or,
        for shared runs, the budget's store: Redis answers for a Redis budget, memory for the rest
        (``prepare_shared`` names a shared journal for the machine budget)."""
        spec, stack = self.spec, self._stack
        if spec.journal is not None:
            journal = SharedJournal(spec.journal) if self.shared else Journal(spec.journal)
            stack.callback(journal.close)
            adopted = journal.serve(spec.client.service)
            if adopted is not None:  # said once: the journal is stamped now
                event("journal", adopted, run_id=self.run_id)
                self._adopted = adopted
            if self.output is not None:
                journal.note_output(self.output.path)
            return journal
        if not self.shared:
            return process_cache(spec.client.base_url)
        if isinstance(self.budget, RedisBudget):
            store = RedisStore(self.budget.url, identity)
            stack.callback(store.close)
            return store
        return shared_memory(identity)

    def _pace_changed(self, change: PaceChange) -> None:
        event("pace", str(change), run_id=self.run_id, pace=change.pace, previous=change.previous, reason=change.reason)
        if self.spec.progress:
            self.bar.write(f"batchsum: {change}")

    def _result(self, stats: BatchStats) -> None:
        self.bar(stats)
        if self._on_result is not None:
            self._on_result(stats)

    @property
    def new_answers(self) -> int:
        """Answers this run added to its store (the journal): what a rerun will not pay for."""
        return (self._final if self._final is not None else _size(self.store)) - self._kept

    @property
    def base_url(self) -> str:
        return self.client.base_url

    def stream(self, rows: Iterable[Any] | AsyncIterator[Any]) -> AsyncIterator[RowResult]:
        """One ``RowResult`` per row, in order (see ``engine.summarize_stream`` for what it raises)."""
        return rows_of(self._results(rows))

    def _results(self, rows: Iterable[Any] | AsyncIterator[Any]) -> AsyncGenerator[RowResult | list[RowResult], None]:
        """The engine's results for ``rows`` in this run: rows, and runs of rows needing no request."""
        return stream_results(
            rows,
            self.client,
            self.spec.params,
            self.options,
            store=self.store,
            stats=self.stats,
            pacer=self.pacer,
            on_result=self._result,
        )

    async def write_dataset(self, source: DatasetInput, batch_rows: int | None = None) -> None:
        """Stream ``source`` through the run into its output: input batches are held only until their
        rows' results arrive, so memory stays bounded.

        A stop that leaves answers nowhere else (a journal that cannot be written, an input that
        broke midway) writes the rows finished so far and commits them, then raises. An interrupt or
        a refused key removes the partial output (the answers are in the journal, and the same
        command resumes), unless every row was already written: a finished output is never thrown
        away, and the stop that came too late is noted in ``late_stop``."""
        output = self.output
        assert output is not None, "Run(..., output=...) makes the output"
        held: deque[pa.RecordBatch] = deque()
        column = source.column
        read_all = False

        def blocks() -> Iterator[RowBlock]:
            nonlocal read_all
            for batch in source.batches(batch_rows):
                held.append(batch)
                yield RowBlock(batch.column(column).to_pylist(), batch.nbytes)
            read_all = True

        finished: list[RowResult] = []
        results = self._results(blocks())
        try:
            async for result in results:
                if isinstance(result, list):
                    finished.extend(result)
                else:
                    finished.append(result)
                while held and len(finished) >= held[0].num_rows:
                    batch = held.popleft()
                    output.write(batch, finished[: batch.num_rows])
                    del finished[: batch.num_rows]
            while held:  # batches of no rows
                output.write(held.popleft(), [])
        except (JournalError, BrokenInputError, RequestCapReached):
            if finished and held:
                output.write(held[0].slice(0, len(finished)), finished)
            output.commit()
            raise
        except (asyncio.CancelledError, KeyboardInterrupt) as exc:
            if not (read_all and not finished and all(batch.num_rows == 0 for batch in held)):
                output.abort()
                raise
            self.late_stop = exc  # every row was written: the output is finished, keep it
        except BaseException:
            output.abort()
            raise
        output.commit()


def _version() -> str:
    from .. import __version__

    return __version__


def write_report(path: str | os.PathLike[str], report: dict[str, Any], *, shared: bool = False) -> None:
    """Write ``report`` to ``path`` (whole, or not at all: a temporary file renamed). A shared run (a
    Dask partition) writes ``STEM.part-RUN.json`` beside it and then merges every part there into
    ``path`` under a lock, so the merged file is whole after each partition."""
    target = os.fspath(path)
    if not shared:
        _write_json(target, report)
        return
    import fcntl
    import glob

    stem, suffix = os.path.splitext(target)
    part = f"{stem}.part-{uuid.uuid4().hex[:12]}{suffix or '.json'}"
    _write_json(part, report)
    with open(target + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        parts = []
        for name in sorted(glob.glob(glob.escape(stem) + ".part-*" + (suffix or ".json"))):
            try:
                with open(name, encoding="utf-8") as file:
                    one = json.load(file)
            except (OSError, ValueError):
                continue
            if one.get("run_id") == report["run_id"]:
                parts.append(one)
        _write_json(target, merge_reports(parts, run_id=report["run_id"]))


def _write_json(path: str, data: dict[str, Any]) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
    with open(temporary, "x", encoding="utf-8") as file:
        json.dump(data, file, indent=2, ensure_ascii=False)
        file.write("\n")
    os.replace(temporary, path)


def _size(store: AnswerStore) -> int:
    try:
        return len(store)  # type: ignore[arg-type]
    except (TypeError, JournalError):
        return 0


async def run_texts(
    spec: RunSpec,
    texts: Iterable[Any],
    *,
    stats: BatchStats | None = None,
    on_result: Callable[[BatchStats], None] | None = None,
    results: list[RowResult] | None = None,
    shared: bool = False,
    warn_at_cap: bool = False,
) -> list[RowResult]:
    """One ``RowResult`` per text, in order; ``results``, when given, is filled as rows finish.
    ``shared``: one of several runs at once (a Dask partition, a Spark task), see ``Run``. At the
    request cap every row still has its record (the unsent ones ``failed`` with ``not_sent``);
    ``RequestCapReached`` is raised, or with ``warn_at_cap`` (the frame front-ends) the rows come
    back with a ``RuntimeWarning`` saying so, and the same call again continues."""
    if not isinstance(texts, Sized):
        texts = list(texts)
    out: list[RowResult] = results if results is not None else []
    try:
        async with Run(spec, total=len(texts), stats=stats, on_result=on_result, shared=shared) as run:
            async for result in run.stream(texts):
                out.append(result)
    except RequestCapReached as exc:
        if not warn_at_cap:
            raise
        warnings.warn(f"{exc}; call it again to continue (answers are kept)", RuntimeWarning, stacklevel=2)
    return out


@document_options
async def summarize_texts(
    texts: Iterable[Any],
    mode: Any = 1,
    percentage: Any = contract.PERCENTAGE_DEFAULT,
    type: Any = None,
    *,
    output_column: str = "summary",
    api_key: str | None = None,
    base_url: str | None = None,
    local: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    max_retries: int = DEFAULT_MAX_RETRIES,
    encoding: str = "json",
    rpm: float | None = None,
    concurrency: int | None = None,
    limiter: Any = None,
    budget: Any = None,
    journal: str | os.PathLike[str] | None = None,
    progress: bool = True,
    long_texts: str = "skip",
    max_wait: float = DEFAULT_MAX_WAIT,
    max_requests: int | None = None,
    sample: int | None = None,
    share: float = 1.0,
    report: str | os.PathLike[str] | None = None,
    stats: BatchStats | None = None,
    on_result: Callable[[BatchStats], None] | None = None,
    results: list[RowResult] | None = None,
) -> list[RowResult]:
    """One ``RowResult`` per text, in order, in the running event loop. ``stats`` is updated live and
    ``on_result`` called after every row; ``results``, when given, is filled as rows finish."""
    spec = RunSpec.from_options(locals())
    return await run_texts(spec, texts, stats=stats, on_result=on_result, results=results)


async def _budget_lines(spec: RunSpec) -> tuple[str, KeyRecord | None]:
    """Which budget a run would join, how many starts it had in the last minute (others' runs), and
    whether the run's first request would go alone; and the key's record at its service."""
    if spec.client.local:
        return (
            "budget:           the local service's own fresh key: no other run uses it\n"
            "first request:    alone: the local service's key is new"
        ), None
    async with AsyncClient(**spec.client.client_kwargs()) as client:
        budget = open_budget(spec.budget, client.identity)
        try:
            seen = await budget.look()
            record = await KeyRecord.recall(budget, _key_hash(spec), spec.client.service)
        finally:
            await budget.aclose()
    pause = f"; paused {seen.paused_for:.0f} s more: {seen.pause_reason}" if seen.paused_for > 0 else ""
    return (
        f"budget:           {budget.where}; {seen.starts} requests started on it in the last minute "
        f"by other runs with this key{pause}\n"
        f"first request:    {record.describe(spec.params.mode)}"
    ), record


def _limit_line(spec: RunSpec, record: KeyRecord | None) -> tuple[str, float | None]:
    """Under ``rpm="auto"``: the limit a run would start from (remembered for the key, or unknown),
    and the rate to estimate with (None: unknown)."""
    found = record.limit() if record is not None else None
    if found is None:
        cap = "" if spec.rpm >= AUTO_MAX_RPM else f" (at most {spec.rpm:g}/min)"
        return (
            f"limit:            not known yet for this key at this service{cap}: the run searches for it "
            "(a few 429s the first time, none failing a row) and remembers it for a week"
        ), None
    rpm = min(found.rpm, spec.rpm)
    return f"limit:            {rpm:g}/min, remembered ({found.describe()}) for this key at this service", rpm


def dry_run(spec: RunSpec, texts: Iterable[Any]) -> str:
    """What a run of ``spec`` over ``texts`` would do, sending nothing and creating no file: rows to
    send, skip, reuse (from the journal, when it exists), the least time, and the budget it joins."""
    with ExitStack() as stack:
        store = None
        if spec.journal is not None and os.path.exists(spec.journal):
            store = stack.enter_context(Journal(spec.journal, readonly=True))
            store.serve(spec.client.service)
        batch = plan_batch(texts, params=spec.params, store=store, long_texts_policy=spec.long_texts)
    record: KeyRecord | None = None
    try:
        budget, record = asyncio.run(_budget_lines(spec))
    except BudgetError as exc:
        budget = f"budget:           not usable ({exc})"
    except ConfigurationError as exc:
        budget = f"budget:           not known ({exc})"
    limit, rate = _limit_line(spec, record) if spec.auto else ("", spec.rpm)
    plan = batch.describe(rate)
    most = batch.to_send + batch.reduce_max
    bound = " (at most; long texts' reduce requests are a bound)" if batch.reduce_max else ""
    needed = f"requests needed:  {most} paid requests for the whole job{bound} (more only for retries)"
    if spec.max_requests is not None:
        runs = -(-most // spec.max_requests) if most else 0
        needed += f"; at max_requests {spec.max_requests}: {runs} run{'s' if runs != 1 else ''}"
    if spec.sample is not None:
        needed += f"; a sample sends at most {min(spec.sample, batch.rows)}"
    plan = f"{plan}\n{needed}"
    if limit:
        plan = f"{plan}\n{limit}"
    return f"{plan}\n{budget}"
