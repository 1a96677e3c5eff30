"""``Run``: one run, opened from a ``RunSpec``. It opens and closes every piece a run needs (the
local service when asked, the client, the key's budget, checked once, the answer store, the pacer,
the progress bar: ``pieces``), tells those who follow it (events, metrics, its report: ``watch``)
and streams rows through the engine; front-ends never open these themselves.

    async with Run(spec, total=len(texts)) as run:
        results = [result async for result in run.stream(texts)]
    run.stats.account()

Also here: ``run_texts`` and ``summarize_texts`` (a list in, a list out). What a front-end needs
around a run is named here too: ``bind`` (the local service started and its address filled in:
``binding``), ``prepare_shared`` (a spec every Dask or Spark worker can open: budget checked,
answers shared: ``shared``), ``dry_run`` (what a run would do, sending nothing: ``preview``) and
``write_report`` (``report``).
"""

from __future__ import annotations

import os
import time
import uuid
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence, Sized
from typing import TYPE_CHECKING, Any

from ..data.results import RowResult
from ..data.stores import AnswerStore
from ..engine.options import RunOptions
from ..engine.stream import rows_of, stream_results
from ..engine.tally import BatchStats
from ..pacing import KeyRecord, Pacer
from ..pacing.budgets.budget import Budget
from ..service import contract
from ..service.client import AsyncClient
from ..service.errors import RequestCapReached
from ..service.retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from ..service.settings import DEFAULT_BUDGET_WAIT, DEFAULT_MAX_WAIT
from .binding import bind as bind
from .binding import local_service as local_service
from .dataset import stream_dataset
from .pieces import SAMPLE_SEED as SAMPLE_SEED
from .pieces import Pieces
from .pieces import sample_rows as sample_rows
from .preview import dry_run as dry_run
from .progress import ProgressBar
from .report import write_report
from .shared import Workers as Workers
from .shared import prepare_shared as prepare_shared
from .spec import RunSpec, document_options
from .watch import PROGRESS_SECONDS as PROGRESS_SECONDS
from .watch import WATCH_SECONDS as WATCH_SECONDS
from .watch import Watch
from .watch import log as log

if TYPE_CHECKING:
    from ..data.datasets import DatasetInput, DatasetOutput

__all__ = [
    "Run",
    "Workers",
    "bind",
    "prepare_shared",
    "summarize_texts",
    "run_texts",
    "dry_run",
    "local_service",
    "write_report",
]


class Run:
    """One run of ``spec``, an async context manager: the pieces open on entry, close on exit.

    ``total``: rows expected (the bar's length). ``shared``: several runs use the answers at once
    (Dask partitions, Spark tasks): no answers in this process's memory, only the answer store
    (with its claims) and a shared journal when one is named. ``stats``: counts to update live
    (a front-end that draws them, such as the app, passes its own). ``on_result``: called with the
    stats after each row. ``locks``: files this run owns while it runs (``RunLock``), ``wait``: wait
    for another run holding them. ``output``: makes the dataset output (``write_dataset``), after the
    locks are taken and before the journal is opened, so that a refused journal leaves no temporary
    output behind; the journal records the location it served. ``client``: the client each key sends
    with (an ``AsyncClient`` subclass: the gateway's hands the service's answers on as they came).
    ``live``: a door whose requests are live (the gateway's): the part of the key they may take ahead
    of the batch runs' reserved starts (its ``--interactive-share``; 0: a batch run).
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
        client: type[AsyncClient] = AsyncClient,
        live: float = 0.0,
    ) -> None:
        self.spec = spec
        self.shared = shared
        self.stats = stats if stats is not None else BatchStats()
        if total is not None:
            self.stats.total = total
        self._on_result = on_result
        self.pieces = Pieces(locks, wait=wait, output=output, client=client, live=live)
        self.watch: Watch
        self.opened = False
        self.late_stop: BaseException | None = None  # a stop that came after every row was done
        self.run_id = spec.run_id or uuid.uuid4().hex[:16]
        self.started_at = time.time()
        self.report: dict[str, Any] | None = None  # the run report, once the run has ended

    async def __aenter__(self) -> Run:
        spec = self.spec = bind(self.spec)
        self.started_at = time.time()
        watch = self.watch = Watch(spec, self.stats, self.pieces, self.run_id, shared=self.shared)
        await self.pieces.open(spec, self.stats, self.run_id, shared=self.shared, on_pace_change=watch.pace_changed)
        watch.start()
        self.opened = True
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self.pieces.count_final()
        await self.watch.stop()
        try:
            await self.pieces.close()
        finally:
            self.report = self.watch.report(exc_info[1] if exc_info[1] is not None else self.late_stop, self.started_at)
            self.watch.end(self.report)

    # The pieces, open from entry to exit.
    @property
    def client(self) -> AsyncClient:
        return self.pieces.client

    @property
    def budget(self) -> Budget:
        return self.pieces.budget

    @property
    def record(self) -> KeyRecord:
        return self.pieces.record

    @property
    def store(self) -> AnswerStore:
        return self.pieces.store

    @property
    def bar(self) -> ProgressBar:
        return self.pieces.bar

    @property
    def options(self) -> RunOptions:
        return self.pieces.options

    @property
    def pacer(self) -> Pacer:
        return self.pieces.pacer

    @property
    def output(self) -> DatasetOutput | None:
        return self.pieces.output

    @property
    def new_answers(self) -> int:
        """Answers this run added to its store (the journal): what a rerun will not pay for."""
        return self.pieces.new_answers

    @property
    def base_url(self) -> str:
        return self.client.base_url

    def _result(self, stats: BatchStats) -> None:
        self.pieces.bar(stats)
        if self._on_result is not None:
            self._on_result(stats)

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
            lanes=self.pieces.lanes,
        )

    async def write_dataset(self, source: DatasetInput, batch_rows: int | None = None) -> None:
        """Stream ``source`` through the run into its output (``dataset.stream_dataset``: what a stop
        keeps); a stop that came after every row was written is noted in ``late_stop``."""
        assert self.output is not None, "Run(..., output=...) makes the output"
        await stream_dataset(source, self.output, self._results, self._late, batch_rows)

    def _late(self, stop: BaseException) -> None:
        self.late_stop = stop


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
    api_key: str | list[str] | None = None,
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
    store: str | None = None,
    refresh: bool = False,
    store_scope: str = "service",
    progress: bool = True,
    long_texts: str = "skip",
    max_wait: float = DEFAULT_MAX_WAIT,
    budget_wait: float = DEFAULT_BUDGET_WAIT,
    max_requests: int | None = None,
    sample: int | None = None,
    share: float = 1.0,
    report: str | os.PathLike[str] | None = None,
    keys: str | os.PathLike[str] | None = None,
    quota: str | None = None,
    stats: BatchStats | None = None,
    on_result: Callable[[BatchStats], None] | None = None,
    results: list[RowResult] | None = None,
) -> list[RowResult]:
    """One ``RowResult`` per text, in order, in the running event loop. ``stats`` is updated live and
    ``on_result`` called after every row; ``results``, when given, is filled as rows finish."""
    spec = RunSpec.from_options(locals())
    return await run_texts(spec, texts, stats=stats, on_result=on_result, results=results)
