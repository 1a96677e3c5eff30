"""``ddf.batchsum`` and ``dseries.batchsum``: summarize a text column of a Dask DataFrame, registered
with Dask's accessor API by ``import batchsum.dask`` (extra ``dask``).

``ddf.batchsum.summarize("text", ..., budget="redis://...")`` returns a lazy Dask DataFrame: every
column plus the result columns, same partitions, index and divisions. Each partition runs the batch
engine on the worker that computes it, against the key's shared rate budget, so all workers
together hold the plan's rate. Answers are shared through the budget's store (Redis for
``redis://``, a SQLite journal for one machine, memory for ``"none"``): an identical text in
another partition is sent once (the first to claim it sends, the others wait for its answer), and
a rerun after a worker or the whole cluster died pays for nothing already answered.

Everything that can be refused is checked when ``summarize`` is called, before anything is sent:
parameters, the column, the budget (reachable, usable by every worker), the key.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

try:
    import dask.dataframe as dd
    from dask.dataframe.extensions import register_dataframe_accessor, register_series_accessor
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("batchsum.dask needs Dask: pip install 'batchsum[dask]'") from exc

import pandas as pd

from . import contract
from ._retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from .budget import ENV_BUDGET, MACHINE, Budget, ProcessBudget, SQLiteBudget, check_budget, open_budget
from .client import AsyncClient, Client, validate_params
from .engine import Answer, AnswerStore, MemoryStore, RowResult, RunOptions, summarize_stream
from .errors import BudgetError
from .pandas_ext import DataFrameAccessor, _check_columns, _frame, _rpm_from_env, _run_in_worker, local_service

__all__ = ["DaskDataFrameAccessor", "DaskSeriesAccessor"]


class _Secret:
    """The API key on its way to the workers: pickled with the task, never shown in a repr."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<api key>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Secret, (self.value,))


class _MemoryClaims(MemoryStore):
    """Answers and claims in this worker process's memory (budget "none": one process)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._claims: set[str] = set()

    def get(self, key: str) -> Answer | None:
        with self._lock:
            return super().get(key)

    def put(self, key: str, answer: Answer) -> None:
        with self._lock:
            super().put(key, answer)

    def claim(self, key: str) -> bool:
        with self._lock:
            if key in self._claims:
                return False
            self._claims.add(key)
            return True

    def release(self, key: str) -> None:
        with self._lock:
            self._claims.discard(key)


_memory: dict[str, _MemoryClaims] = {}
_memory_lock = threading.Lock()


@dataclass(frozen=True)
class _Job:
    """What every partition needs, checked once on the client and shipped to the workers."""

    column: Hashable | None  # None: the partition is a Series
    output_column: str
    params: contract.Params
    rpm: float
    concurrency: int | None
    budget: str
    journal: str | None  # a SharedJournal path; None: the budget's own store (Redis, memory)
    base_url: str
    key: _Secret
    timeout: float
    max_retries: int
    encoding: str

    def store(self, identity: str) -> AnswerStore:
        if self.journal is not None:
            from .journal import SharedJournal

            return SharedJournal(self.journal)
        if self.budget.lower().startswith(("redis://", "rediss://", "unix://")):
            from .journal import RedisStore

            return RedisStore(self.budget, identity)
        with _memory_lock:
            return _memory.setdefault(identity, _MemoryClaims())

    async def results(self, texts: list[Any]) -> list[RowResult]:
        async with AsyncClient(
            self.key.value,
            self.base_url,
            timeout=self.timeout,
            max_retries=self.max_retries,
            encoding=self.encoding,  # type: ignore[arg-type]  # checked on the client
        ) as client:
            budget = open_budget(self.budget, client.identity)
            store = self.store(client.identity)
            options = RunOptions(rpm=self.rpm, concurrency=self.concurrency, budget=budget)
            try:
                return [result async for result in summarize_stream(texts, client, self.params, options, store=store)]
            finally:
                await budget.aclose()
                close = getattr(store, "close", None)
                if close is not None:
                    close()

    def __call__(self, part: pd.DataFrame | pd.Series) -> pd.DataFrame:
        column: pd.Series = part if isinstance(part, pd.Series) else part[self.column]
        texts = column.tolist()
        results = _run_in_worker(lambda: self.results(texts))
        if isinstance(part, pd.Series):
            return _frame(results, part.index, self.output_column)
        return DataFrameAccessor(part)._join(results, self.output_column)


def _partition(part: pd.DataFrame | pd.Series, job: _Job) -> pd.DataFrame:
    return job(part)


def _workers() -> list[str] | None:
    """The worker addresses of the distributed client in use; None without one (threads or
    processes of the local scheduler: partitions then run on this machine)."""
    try:
        from distributed import get_client
    except ImportError:
        return None
    try:
        client = get_client()
    except ValueError:
        return None
    return list(client.scheduler_info(n_workers=-1)["workers"])


def _check_cluster(budget: Budget, spec: str) -> None:
    """Refuse a budget the workers cannot share, with what to pass instead."""
    workers = _workers()
    if workers is None:
        return
    if isinstance(budget, ProcessBudget) and len(workers) > 1:
        raise BudgetError(
            f"budget {spec!r} paces each process alone, and this Dask cluster runs partitions in {len(workers)} "
            "worker processes: together they would send that many times your plan's rate. Pass budget='machine' "
            "(workers on this machine) or budget='redis://HOST:PORT/DB' (workers on several machines)"
        )
    hosts = {urlsplit(address).hostname for address in workers}
    if isinstance(budget, SQLiteBudget) and len(hosts) > 1:
        raise BudgetError(
            f"budget {spec!r} is shared only by the processes of one machine, and this Dask cluster's workers are on "
            f"{len(hosts)} hosts: pass budget='redis://HOST:PORT/DB'"
        )


def _default_journal(budget: Budget, identity: str) -> Path | None:
    if isinstance(budget, SQLiteBudget):
        return budget.path.with_name(f"answers-{identity[:16]}.sqlite")
    return None


class _Summarize:
    """``summarize`` for both accessors: everything checked on the client, then one lazy map."""

    def __init__(self, data: Any) -> None:
        self._data = data  # a dd.DataFrame or a dd.Series, by the accessor

    def _job(
        self,
        column: Hashable | None,
        mode: Any,
        percentage: Any,
        type: Any,
        *,
        output_column: str,
        budget: str | None,
        journal: str | Path | None,
        rpm: float | None,
        concurrency: int | None,
        api_key: str | None,
        base_url: str | None,
        local: bool,
        timeout: float,
        max_retries: int,
        encoding: str,
    ) -> _Job:
        params = validate_params(mode, percentage, type)
        if rpm is None:
            rpm = 0.0 if local else _rpm_from_env()
        RunOptions(rpm=rpm, concurrency=concurrency)  # validates both
        if budget is not None and not isinstance(budget, str):
            raise BudgetError(f"invalid budget {budget!r}: on Dask, pass a string: 'machine', 'redis://HOST:PORT/DB'")
        if local:
            service = local_service()
            api_key, base_url = service.key, service.url
        with Client(api_key, base_url, timeout=timeout, max_retries=max_retries, encoding=encoding) as client:  # type: ignore[arg-type]
            identity, base_url, key = client.identity, client.base_url, client._core.api_key
        spec = budget if budget is not None else (os.environ.get(ENV_BUDGET, "").strip() or MACHINE)
        opened = open_budget(spec, identity)
        _run_in_worker(lambda: check_budget(opened))
        _check_cluster(opened, spec)
        if isinstance(opened, SQLiteBudget):
            spec = f"sqlite://{opened.path}"  # the same file on every worker, whatever their cache folder
        journal_path = Path(journal) if journal is not None else _default_journal(opened, identity)
        if journal_path is not None:
            from .journal import SharedJournal

            SharedJournal(journal_path).close()  # created here, once, before the workers open it
        return _Job(
            column=column,
            output_column=output_column,
            params=params,
            rpm=float(rpm),
            concurrency=concurrency,
            budget=spec,
            journal=None if journal_path is None else str(journal_path),
            base_url=base_url,
            key=_Secret(key),
            timeout=timeout,
            max_retries=max_retries,
            encoding=encoding,
        )


class DaskDataFrameAccessor(_Summarize):
    """``ddf.batchsum.summarize("text", ...)``: every column plus the result columns, lazily."""

    def summarize(
        self,
        column: Hashable,
        mode: Any = 1,
        percentage: Any = 4,
        type: Any = None,
        *,
        output_column: str = "summary",
        budget: str | None = None,
        journal: str | Path | None = None,
        rpm: float | None = None,
        concurrency: int | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        local: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        encoding: str = "json",
    ) -> dd.DataFrame:
        """A lazy Dask DataFrame: every column of ``ddf`` plus ``summary``, ``summary_status``,
        ``summary_error``, ``summary_message``, ``summary_http_status``, ``summary_attempts``;
        same partitions, index and divisions. Nothing is sent until it is computed (``compute()``,
        ``to_parquet(...)``).

        ``budget``: the key's rate budget every worker shares: ``"machine"`` (default, or
        ``$BATCHSUM_BUDGET``; workers on this machine), ``"redis://HOST:PORT/DB"`` (workers on
        several machines) or ``"none"`` (one worker process only). ``journal``: a SQLite file the
        answers are shared and kept in (default: the budget's store: Redis for ``redis://``, a
        journal beside the machine budget in the user's cache folder, memory for ``"none"``).
        The other options are the pandas accessor's (``rpm``, ``concurrency``, ``api_key``,
        ``base_url``, ``local``, ``timeout``, ``max_retries``, ``encoding``). Raises, before
        anything is sent: ``InputError`` (column), ``InvalidParameterError``, ``ConfigurationError``
        (key, URL), ``BudgetError`` (an unusable budget, or one the cluster's workers cannot share).
        """
        frame: dd.DataFrame = self._data
        _check_columns(frame.columns, column, output_column)
        job = self._job(
            column,
            mode,
            percentage,
            type,
            output_column=output_column,
            budget=budget,
            journal=journal,
            rpm=rpm,
            concurrency=concurrency,
            api_key=api_key,
            base_url=base_url,
            local=local,
            timeout=timeout,
            max_retries=max_retries,
            encoding=encoding,
        )
        meta = DataFrameAccessor(frame._meta)._join([], output_column)
        return frame.map_partitions(_partition, job, meta=meta, align_dataframes=False)


class DaskSeriesAccessor(_Summarize):
    """``dseries.batchsum.summarize(...)``: the result columns as a lazy Dask DataFrame."""

    def summarize(
        self, mode: Any = 1, percentage: Any = 4, type: Any = None, *, output_column: str = "summary", **options: Any
    ) -> dd.DataFrame:
        """The result columns on the Series' index; options as ``DaskDataFrameAccessor.summarize``."""
        series: dd.Series = self._data
        job = self._job(None, mode, percentage, type, output_column=output_column, **{**_SERIES_DEFAULTS, **options})
        meta = _frame([], series._meta.index, output_column)
        return series.map_partitions(_partition, job, meta=meta, align_dataframes=False)


_SERIES_DEFAULTS: dict[str, Any] = {
    "budget": None,
    "journal": None,
    "rpm": None,
    "concurrency": None,
    "api_key": None,
    "base_url": None,
    "local": False,
    "timeout": DEFAULT_TIMEOUT,
    "max_retries": DEFAULT_MAX_RETRIES,
    "encoding": "json",
}

register_dataframe_accessor("batchsum")(DaskDataFrameAccessor)
register_series_accessor("batchsum")(DaskSeriesAccessor)
