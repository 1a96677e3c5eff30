"""``ddf.batchsum`` and ``dseries.batchsum``: summarize a text column of a Dask DataFrame, registered
with Dask's accessor API by ``import batchsum.dask`` (extra ``dask``).

``ddf.batchsum.summarize("text", ..., budget="redis://...")`` returns a lazy Dask DataFrame: every
column plus the result columns, same partitions, index and divisions. Each partition is one run
(``run.Run``, shared) on the worker that computes it, against the key's shared rate budget, so all
workers together hold the plan's rate. Answers are shared through the budget's store (Redis for
``redis://``, a SQLite journal for one machine, memory for ``"none"``): an identical text in
another partition is sent once (the first to claim it sends, the others wait for its answer), and
a rerun after a worker or the whole cluster died pays for nothing already answered.

Everything that can be refused is checked when ``summarize`` is called, before anything is sent:
parameters, the column, the budget (reachable, usable by every worker), the key.
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from typing import Any
from urllib.parse import urlsplit

try:
    import dask.dataframe as dd
    from dask.dataframe.extensions import register_dataframe_accessor, register_series_accessor
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("batchsum.dask needs Dask: pip install 'batchsum[dask]'") from exc

import pandas as pd

from . import contract
from ._background import run_in_worker
from ._retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from .budget import Budget, ProcessBudget, SQLiteBudget
from .errors import BudgetError, RequestCapReached
from .options import DEFAULT_MAX_WAIT, RunSpec, document_options
from .results import RowResult, check_columns, join_results, results_frame
from .run import prepare_shared, run_texts

__all__ = ["DaskDataFrameAccessor", "DaskSeriesAccessor"]


def _portion(total: int | None, partitions: int, number: int) -> int | None:
    """Partition ``number``'s part of a job's ``total`` (a request cap, a sample): the parts add up
    to ``total``, so the job as a whole never goes past it."""
    if total is None:
        return None
    return total // partitions + (1 if number < total % partitions else 0)


def _partition(
    part: pd.DataFrame | pd.Series,
    spec: RunSpec,
    column: Hashable | None,
    partitions: int = 1,
    partition_info: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """One partition, on the worker: a shared run over its texts, the results joined back. The
    job's request cap and sample are divided among the partitions; a partition that reaches its
    part of the cap returns every row (the unsent ones ``failed`` with ``not_sent``), as the CLI's
    output does, and the run report says the run stopped."""
    texts = (part if isinstance(part, pd.Series) else part[column]).tolist()
    number = partition_info["number"] if partition_info else 0
    spec = spec.replace(
        max_requests=_portion(spec.max_requests, partitions, number), sample=_portion(spec.sample, partitions, number)
    )
    results: list[RowResult] = []
    try:
        run_in_worker(lambda: run_texts(spec, texts, shared=True, results=results))
    except RequestCapReached:
        pass  # every row has its record in ``results``
    if isinstance(part, pd.Series):
        return results_frame(results, part.index, spec.output_column)
    return join_results(part, results, spec.output_column)


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


def _worker_spec(values: dict[str, Any]) -> RunSpec:
    """The spec every partition opens, checked once here on the client."""
    if values.get("budget") is not None and not isinstance(values["budget"], str):
        raise BudgetError(
            f"invalid budget {values['budget']!r}: on Dask, pass a string: 'machine', 'redis://HOST:PORT/DB'"
        )
    return prepare_shared(RunSpec.from_options(values), check=_check_cluster)


class DaskDataFrameAccessor:
    """``ddf.batchsum.summarize("text", ...)``: every column plus the result columns, lazily."""

    def __init__(self, data: dd.DataFrame) -> None:
        self._data = data

    @document_options
    def summarize(
        self,
        column: Hashable,
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
        budget: Any = None,
        journal: str | os.PathLike[str] | None = None,
        progress: bool = False,
        max_wait: float = DEFAULT_MAX_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
    ) -> dd.DataFrame:
        """A lazy Dask DataFrame: every column of ``ddf`` plus ``summary``, ``summary_status``,
        ``summary_error``, ``summary_message``, ``summary_http_status``, ``summary_attempts``;
        same partitions, index and divisions. Nothing is sent until it is computed (``compute()``,
        ``to_parquet(...)``).

        ``budget`` is the key's rate budget every worker shares: ``"machine"`` (workers on this
        machine), ``"redis://HOST:PORT/DB"`` (workers on several machines) or ``"none"`` (one worker
        process only). ``journal``: a SQLite file the answers are shared and kept in (default: the
        budget's store: Redis for ``redis://``, a journal beside the machine budget in the user's
        cache folder, memory for ``"none"``). ``progress``: a bar per partition, on the worker.
        Raises, before anything is sent: ``InputError`` (column), ``InvalidParameterError``,
        ``ConfigurationError`` (key, URL), ``BudgetError`` (an unusable budget, or one the
        cluster's workers cannot share)."""
        frame: dd.DataFrame = self._data
        check_columns(frame.columns, column, output_column)
        spec = _worker_spec(locals())
        meta = join_results(frame._meta, [], spec.output_column)
        return frame.map_partitions(_partition, spec, column, frame.npartitions, meta=meta, align_dataframes=False)


class DaskSeriesAccessor:
    """``dseries.batchsum.summarize(...)``: the result columns as a lazy Dask DataFrame."""

    def __init__(self, data: dd.Series) -> None:
        self._data = data

    @document_options
    def summarize(
        self,
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
        budget: Any = None,
        journal: str | os.PathLike[str] | None = None,
        progress: bool = False,
        max_wait: float = DEFAULT_MAX_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
    ) -> dd.DataFrame:
        """The result columns on the Series' index, lazily (see ``ddf.batchsum.summarize``)."""
        series: dd.Series = self._data
        spec = _worker_spec(locals())
        meta = results_frame([], series._meta.index, spec.output_column)
        return series.map_partitions(_partition, spec, None, series.npartitions, meta=meta, align_dataframes=False)


register_dataframe_accessor("batchsum")(DaskDataFrameAccessor)
register_series_accessor("batchsum")(DaskSeriesAccessor)
