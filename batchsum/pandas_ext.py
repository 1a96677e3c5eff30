"""``df.batchsum`` and ``series.batchsum``: summarize a text column, registered with pandas'
accessor API when ``batchsum`` is imported.

The synchronous calls run the engine on a worker thread with its own event loop, so they work
unchanged inside a running loop (Jupyter, IPython, an async app). An interrupt (the stop button,
Ctrl-C) stops sending at once; finished answers stay in an in-process cache (and in the journal
when ``journal=`` is given), so calling the same thing again sends only what was not finished.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import threading
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, TypeVar

import pandas as pd

from . import contract
from ._retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from .budget import Budget, open_budget
from .client import AsyncClient, validate_params
from .engine import (
    RESULT_DTYPES,
    AnswerStore,
    BatchStats,
    MemoryStore,
    RowResult,
    RunOptions,
    result_columns,
    summarize_stream,
)
from .errors import InputError, InvalidParameterError
from .pacing import Limiter

__all__ = ["DataFrameAccessor", "SeriesAccessor", "summarize_texts", "clear_cache", "local_service", "BackgroundRun"]

T = TypeVar("T")
DEFAULT_RPM = 60.0

_caches: dict[str, MemoryStore] = {}
_local: Any = None
_lock = threading.Lock()


def clear_cache() -> None:
    """Forget the answers cached in this process (the journal on disk is untouched)."""
    with _lock:
        _caches.clear()


def local_service() -> Any:
    """The process-wide local reference service behind ``local=True`` (started on first use)."""
    global _local
    with _lock:
        if _local is None:
            from .local import LocalService

            _local = LocalService().start()
        return _local


def _rpm_from_env() -> float:
    raw = os.environ.get("BATCHSUM_RPM", str(DEFAULT_RPM))
    try:
        return float(raw)
    except ValueError:
        raise InvalidParameterError(f"invalid $BATCHSUM_RPM {raw!r}: use a number of requests per minute") from None


def _cache_for(base_url: str) -> MemoryStore:
    with _lock:
        return _caches.setdefault(base_url, MemoryStore())


class BackgroundRun:
    """A coroutine run to completion on its own event loop in a worker thread, so that it works
    whatever loop the caller is in; ``cancel()`` from any thread cancels it there, which lets
    requests on the wire finish and keeps their answers."""

    def __init__(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        self._make = make
        self._ready, self._finished = threading.Event(), threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._outcome: tuple[bool, Any] = (False, None)
        threading.Thread(target=self._target, name="batchsum-worker", daemon=True).start()

    async def _main(self) -> Any:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        self._ready.set()
        return await self._make()

    def _target(self) -> None:
        try:
            self._outcome = (True, asyncio.run(self._main()))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self._outcome = (False, exc)
        finally:
            self._ready.set()
            self._finished.set()

    def cancel(self) -> None:
        """Cancel the run, also when it has not reached its event loop yet."""
        self._ready.wait()
        if self._loop is not None and self._task is not None and not self._task.done():
            self._loop.call_soon_threadsafe(self._task.cancel)

    def wait(self, timeout: float | None = None) -> bool:
        """True once the run has finished. An Event, not Thread.join(): on CPython < 3.13 an
        interrupt inside join() can leave the thread marked finished while it still runs."""
        return self._finished.wait(timeout)

    def result(self) -> Any:
        """The coroutine's result, or its exception raised here (CancelledError when cancelled)."""
        done, value = self._outcome
        if not done:
            raise value
        return value


def _run_in_worker(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine in a ``BackgroundRun`` and wait; an interrupt in the calling thread cancels
    it (letting requests on the wire finish) and is re-raised."""
    run = BackgroundRun(make)
    try:
        while not run.wait(0.1):
            pass
    except KeyboardInterrupt:
        run.cancel()
        run.wait()  # requests on the wire finish and are kept; a second interrupt leaves at once
        print(
            "batchsum: interrupted; finished answers are kept, so the same call again sends only the rest",
            file=sys.stderr,
        )
        raise
    try:
        result: T = run.result()
        return result
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None


async def summarize_texts(
    texts: Any,
    mode: Any = contract.Mode.STANDARD,
    percentage: Any = contract.PERCENTAGE_DEFAULT,
    type: Any = None,
    *,
    rpm: float | None = None,
    concurrency: int | None = None,
    limiter: Limiter | None = None,
    budget: str | Budget | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    local: bool = False,
    progress: bool = True,
    journal: str | os.PathLike[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    max_retries: int = DEFAULT_MAX_RETRIES,
    encoding: str = "json",
    stats: BatchStats | None = None,
    on_result: Callable[[BatchStats], None] | None = None,
    results: list[RowResult] | None = None,
) -> list[RowResult]:
    """One ``RowResult`` per text, in order: the engine with the accessor's defaults.

    ``rpm`` defaults to ``$BATCHSUM_RPM`` or 60 (0 with ``local=True``); ``concurrency`` caps the
    requests in flight (None: sized from the pace and the measured latency); ``limiter`` is your own floor
    under the pace (``async acquire()``, e.g. an ``AsyncLimiter`` shared by several batches).
    ``budget``: the key's rate budget, shared with every other run using the key: ``"machine"``
    (default, or ``$BATCHSUM_BUDGET``: every process on this machine), ``"redis://HOST:PORT/DB"``
    (every machine), ``"sqlite:///PATH"``, ``"none"`` (this process), or a ``Budget``. ``results``,
    when given, is filled as rows finish (the widget's live preview reads it).
    """
    params = validate_params(mode, percentage, type)
    if rpm is None:
        rpm = 0.0 if local else _rpm_from_env()
    options = RunOptions(rpm=rpm, concurrency=concurrency, limiter=limiter)
    if budget is not None and not isinstance(budget, (str, Budget)):
        raise InvalidParameterError(
            f"invalid budget {budget!r}: use 'machine', 'none', 'redis://HOST:PORT/DB' or a Budget"
        )
    if local:
        service = local_service()
        api_key, base_url = service.key, service.url
    texts = list(texts)
    stats = stats if stats is not None else BatchStats(total=len(texts))
    stats.total = len(texts)
    out: list[RowResult] = results if results is not None else []
    async with AsyncClient(api_key, base_url, timeout=timeout, max_retries=max_retries, encoding=encoding) as client:  # type: ignore[arg-type]
        shared = open_budget(budget, client.identity)
        await shared.check()  # an unreachable or unusable budget: one line, before anything is sent
        options = dataclasses.replace(options, budget=shared)
        from .journal import Journal

        store: AnswerStore
        if journal is not None:
            store = Journal(journal)
        else:
            store = _cache_for(client.base_url)
        from .progress import ProgressBar

        bar = ProgressBar(len(texts), enabled=progress)

        def update(current: BatchStats) -> None:
            bar(current)
            if on_result is not None:
                on_result(current)

        try:
            async for result in summarize_stream(
                texts,
                client,
                params,
                options,
                store=store,
                stats=stats,
                on_result=update,
            ):
                out.append(result)
        finally:
            bar.close()
            await shared.aclose()
            if isinstance(store, Journal):
                store.close()
    return out


def _frame(results: list[RowResult], index: pd.Index, output_column: str) -> pd.DataFrame:
    names = result_columns(output_column)
    columns: list[tuple[Any, ...]] = list(zip(*results)) if results else [() for _ in names]
    frame: pd.DataFrame = pd.DataFrame(
        {
            name: pd.Series(list(values), dtype=dtype, index=index)
            for name, values, dtype in zip(names, columns, RESULT_DTYPES)
        },
        index=index,
    )
    return frame


def _with_record(out: pd.DataFrame, stats: BatchStats) -> pd.DataFrame:
    """``out`` carrying the run's account and timeline in ``out.attrs["batchsum"]`` (``plot_run``)."""
    out.attrs["batchsum"] = stats.record()
    return out


def _check_columns(columns: Any, column: Hashable, output_column: str) -> None:
    """The text column is there and the result columns are not (a pandas or Dask frame's columns)."""
    if column not in columns:
        shown = ", ".join(map(repr, list(columns)[:20]))
        raise InputError(f"no column {column!r} in the DataFrame; its columns are: {shown}")
    _check_output(columns, output_column)


def _check_output(columns: pd.Index, output_column: str) -> None:
    clash = [name for name in result_columns(output_column) if name in columns]
    if clash:
        raise InputError(f"the DataFrame already has column {clash[0]!r}; pass output_column='...' to name the results")


class SeriesAccessor:
    """``series.batchsum.summarize(...)``: the result columns as a DataFrame on the Series' index."""

    def __init__(self, series: pd.Series) -> None:
        self._series = series

    def summarize(
        self, mode: Any = 1, percentage: Any = 4, type: Any = None, *, output_column: str = "summary", **options: Any
    ) -> pd.DataFrame:
        """Summarize every value; see ``DataFrameAccessor.summarize`` for the options."""
        return _run_in_worker(lambda: self.asummarize(mode, percentage, type, output_column=output_column, **options))

    async def asummarize(
        self, mode: Any = 1, percentage: Any = 4, type: Any = None, *, output_column: str = "summary", **options: Any
    ) -> pd.DataFrame:
        """``await series.batchsum.asummarize(...)``: the same, in the running event loop."""
        stats = options.pop("stats", None) or BatchStats()
        results = await summarize_texts(self._series.tolist(), mode, percentage, type, stats=stats, **options)
        return _with_record(_frame(results, self._series.index, output_column), stats)


class DataFrameAccessor:
    """``df.batchsum.summarize("text", ...)``: every column of ``df`` plus the result columns."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self._frame = frame

    def _column(self, column: Hashable, output_column: str) -> pd.Series:
        _check_columns(self._frame.columns, column, output_column)
        series = self._frame[column]
        if isinstance(series, pd.DataFrame):
            raise InputError(f"column name {column!r} is not unique in the DataFrame")
        return series

    def summarize(
        self,
        column: Hashable,
        mode: Any = 1,
        percentage: Any = 4,
        type: Any = None,
        *,
        output_column: str = "summary",
        **options: Any,
    ) -> pd.DataFrame:
        """A new DataFrame: every column of ``df`` plus ``summary``, ``summary_status``,
        ``summary_error``, ``summary_message``, ``summary_http_status``, ``summary_attempts``;
        same index (any kind) and row order. ``out.attrs["batchsum"]`` holds the run's account and
        timeline (requests per minute, 429s, pauses, pace), which ``batchsum.plot_run(out)`` draws.

        Options: ``rpm`` (default $BATCHSUM_RPM or 60; starts evenly spaced under it), ``concurrency``
        (a cap on requests in flight; default: sized from the pace and the latency), ``limiter``,
        ``budget`` (the key's rate budget shared across processes: "machine" by default, "redis://...",
        "none"; see ``summarize_texts``),
        ``api_key``/``base_url`` (default $BATCHSUM_API_KEY / $BATCHSUM_BASE_URL), ``local=True``
        (use the local reference service), ``progress`` (a tqdm bar; notebook or terminal),
        ``journal`` (a SQLite path that keeps answers across sessions), ``timeout``,
        ``max_retries``, ``encoding``. Works inside a running event loop; an interrupt keeps
        finished answers, so the same call again sends only the rest. Raises ``InputError`` for a
        missing column, ``InvalidParameterError`` for bad parameters (before sending), and
        ``AuthenticationError``/``NotPremiumError`` when the service refuses the key or plan.
        """
        series = self._column(column, output_column)
        stats = options.pop("stats", None) or BatchStats()
        results = _run_in_worker(
            lambda: summarize_texts(series.tolist(), mode, percentage, type, stats=stats, **options)
        )
        return _with_record(self._join(results, output_column), stats)

    async def asummarize(
        self,
        column: Hashable,
        mode: Any = 1,
        percentage: Any = 4,
        type: Any = None,
        *,
        output_column: str = "summary",
        **options: Any,
    ) -> pd.DataFrame:
        """``await df.batchsum.asummarize(...)``: the same, in the running event loop."""
        series = self._column(column, output_column)
        stats = options.pop("stats", None) or BatchStats()
        results = await summarize_texts(series.tolist(), mode, percentage, type, stats=stats, **options)
        return _with_record(self._join(results, output_column), stats)

    def _join(self, results: list[RowResult], output_column: str) -> pd.DataFrame:
        out = self._frame.copy()
        for name, values in _frame(results, self._frame.index, output_column).items():
            out[name] = values.array  # positional: no index alignment, dtype kept
        return out  # type: ignore[no-any-return]


pd.api.extensions.register_dataframe_accessor("batchsum")(DataFrameAccessor)
pd.api.extensions.register_series_accessor("batchsum")(SeriesAccessor)
