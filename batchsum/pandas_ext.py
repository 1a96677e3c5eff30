"""``df.batchsum`` and ``series.batchsum``: summarize a text column, registered with pandas'
accessor API when ``batchsum`` is imported.

The synchronous calls run on a worker thread with its own event loop (``_background``), so they
work unchanged inside a running loop (Jupyter, IPython, an async app). An interrupt (the stop button,
Ctrl-C) stops sending at once; finished answers stay in an in-process cache (and in the journal when
``journal=`` is given), so calling the same thing again sends only what was not finished.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Hashable
from typing import Any

import pandas as pd

from . import contract
from ._background import run_in_worker
from ._retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from .errors import InputError, RequestCapReached
from .options import DEFAULT_MAX_WAIT, RunSpec, document_options
from .report import BatchStats
from .results import RowResult, check_columns, join_results, results_frame
from .run import run_texts
from .stores import clear_process_caches

__all__ = ["DataFrameAccessor", "SeriesAccessor", "clear_cache"]


def clear_cache() -> None:
    """Forget the answers cached in this process (the journal on disk is untouched)."""
    clear_process_caches()


def _with_record(out: pd.DataFrame, stats: BatchStats) -> pd.DataFrame:
    """``out`` carrying the run's account and timeline in ``out.attrs["batchsum"]`` (``plot_run``)."""
    out.attrs["batchsum"] = stats.record()
    return out


async def _results(series: pd.Series, spec: RunSpec, stats: BatchStats) -> list[RowResult]:
    """Every row's result. At the request cap every row still has its record (the unsent ones
    ``failed`` with ``not_sent``): the frame comes back, with a ``RuntimeWarning`` saying so, and
    calling the same thing again continues."""
    results: list[RowResult] = []
    try:
        await run_texts(spec, series.tolist(), stats=stats, results=results)
    except RequestCapReached as exc:
        warnings.warn(f"{exc}; call it again to continue (answers are kept)", RuntimeWarning, stacklevel=2)
    return results


class SeriesAccessor:
    """``series.batchsum.summarize(...)``: the result columns as a DataFrame on the Series' index."""

    def __init__(self, series: pd.Series) -> None:
        self._series = series

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
        limiter: Any = None,
        budget: Any = None,
        journal: str | os.PathLike[str] | None = None,
        progress: bool = True,
        max_wait: float = DEFAULT_MAX_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
    ) -> pd.DataFrame:
        """Summarize every value: the result columns on the Series' index (see ``df.batchsum.summarize``)."""
        spec = RunSpec.from_options(locals())
        stats = BatchStats()
        results = run_in_worker(lambda: _results(self._series, spec, stats))
        return _with_record(results_frame(results, self._series.index, spec.output_column), stats)

    @document_options
    async def asummarize(
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
        limiter: Any = None,
        budget: Any = None,
        journal: str | os.PathLike[str] | None = None,
        progress: bool = True,
        max_wait: float = DEFAULT_MAX_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
    ) -> pd.DataFrame:
        """``await series.batchsum.asummarize(...)``: the same, in the running event loop."""
        spec = RunSpec.from_options(locals())
        stats = BatchStats()
        results = await _results(self._series, spec, stats)
        return _with_record(results_frame(results, self._series.index, spec.output_column), stats)


class DataFrameAccessor:
    """``df.batchsum.summarize("text", ...)``: every column of ``df`` plus the result columns."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self._frame = frame

    def column(self, column: Hashable, output_column: str) -> pd.Series:
        """The text column, when it is there (once) and the result columns are not."""
        check_columns(self._frame.columns, column, output_column)
        series = self._frame[column]
        if isinstance(series, pd.DataFrame):
            raise InputError(f"column name {column!r} is not unique in the DataFrame")
        return series

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
        limiter: Any = None,
        budget: Any = None,
        journal: str | os.PathLike[str] | None = None,
        progress: bool = True,
        max_wait: float = DEFAULT_MAX_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
    ) -> pd.DataFrame:
        """A new DataFrame: every column of ``df`` plus ``summary``, ``summary_status``,
        ``summary_error``, ``summary_message``, ``summary_http_status``, ``summary_attempts``; same
        index (any kind) and row order. ``out.attrs["batchsum"]`` holds the run's account and timeline
        (requests per minute, 429s, pauses, pace), which ``batchsum.plot_run(out)`` draws.

        Works inside a running event loop; an interrupt keeps finished answers, so the same call again
        sends only the rest. Raises ``InputError`` for a missing column, ``InvalidParameterError`` for
        bad parameters (before sending), and ``AuthenticationError``/``NotPremiumError`` when the
        service refuses the key or plan."""
        spec = RunSpec.from_options(locals())
        series = self.column(column, spec.output_column)
        stats = BatchStats()
        results = run_in_worker(lambda: _results(series, spec, stats))
        return _with_record(join_results(self._frame, results, spec.output_column), stats)

    @document_options
    async def asummarize(
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
        limiter: Any = None,
        budget: Any = None,
        journal: str | os.PathLike[str] | None = None,
        progress: bool = True,
        max_wait: float = DEFAULT_MAX_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
    ) -> pd.DataFrame:
        """``await df.batchsum.asummarize(...)``: the same, in the running event loop."""
        spec = RunSpec.from_options(locals())
        series = self.column(column, spec.output_column)
        stats = BatchStats()
        results = await _results(series, spec, stats)
        return _with_record(join_results(self._frame, results, spec.output_column), stats)


pd.api.extensions.register_dataframe_accessor("batchsum")(DataFrameAccessor)
pd.api.extensions.register_series_accessor("batchsum")(SeriesAccessor)
