"""``df.batchsum`` and ``series.batchsum``: summarize a text column, registered with pandas'
accessor API when ``batchsum`` is imported.

The synchronous calls run on a worker thread with its own event loop (``run.background``), so they
work unchanged inside a running loop (Jupyter, IPython, an async app). An interrupt (the stop button,
Ctrl-C) stops sending at once; finished answers stay in an in-process cache (and in the journal when
``journal=`` is given), so calling the same thing again sends only what was not finished.
"""

from __future__ import annotations

from collections.abc import Hashable

import pandas as pd

from ._frame_accessor import ColumnSummarize, ColumnSummarizeAsync, ValuesSummarize, ValuesSummarizeAsync
from .data.results import RowResult, check_columns, column_blocks, join_results, results_frame
from .data.stores import clear_process_caches
from .engine.tally import BatchStats
from .run.background import run_in_worker
from .run.run import run_texts
from .run.spec import RunSpec
from .service.errors import InputError

__all__ = ["DataFrameAccessor", "SeriesAccessor", "clear_cache"]


def clear_cache() -> None:
    """Forget the answers cached in this process (the journal on disk is untouched)."""
    clear_process_caches()


class _Accessor:
    """A pandas DataFrame's or Series' texts in, its results out: ``out.attrs["batchsum"]`` holds the
    run's account and timeline (requests per minute, 429s, pauses, pace), which
    ``batchsum.plot_run(out)`` draws."""

    door = "pandas"

    def __init__(self, data: pd.DataFrame | pd.Series) -> None:
        self._data = data

    def _texts(self, column: Hashable, spec: RunSpec) -> pd.Series:
        if isinstance(self._data, pd.Series):
            return self._data
        check_columns(self._data.columns, column, spec.output_column)
        series = self._data[column]
        if isinstance(series, pd.DataFrame):
            raise InputError(f"column name {column!r} is not unique in the DataFrame")
        return series

    def _frame(self, results: list[RowResult], spec: RunSpec, stats: BatchStats) -> pd.DataFrame:
        if isinstance(self._data, pd.Series):
            out = results_frame(results, self._data.index, spec.output_column)
        else:
            out = join_results(self._data, results, spec.output_column)
        out.attrs["batchsum"] = stats.record()
        return out

    def _summarize(self, column: Hashable, spec: RunSpec) -> pd.DataFrame:
        texts, stats = column_blocks(self._texts(column, spec)), BatchStats()
        return self._frame(run_in_worker(lambda: run_texts(spec, texts, stats=stats, warn_at_cap=True)), spec, stats)

    async def _asummarize(self, column: Hashable, spec: RunSpec) -> pd.DataFrame:
        texts, stats = column_blocks(self._texts(column, spec)), BatchStats()
        return self._frame(await run_texts(spec, texts, stats=stats, warn_at_cap=True), spec, stats)


class DataFrameAccessor(_Accessor, ColumnSummarize[pd.DataFrame], ColumnSummarizeAsync[pd.DataFrame]):
    """``df.batchsum.summarize("text", ...)``: a new DataFrame, every column of ``df`` plus the result
    columns, same index (any kind) and row order. Works inside a running event loop
    (``await df.batchsum.asummarize(...)`` too); an interrupt keeps finished answers, so the same
    call again sends only the rest."""


class SeriesAccessor(_Accessor, ValuesSummarize[pd.DataFrame], ValuesSummarizeAsync[pd.DataFrame]):
    """``series.batchsum.summarize(...)``: the result columns as a DataFrame on the Series' index."""


pd.api.extensions.register_dataframe_accessor("batchsum")(DataFrameAccessor)
pd.api.extensions.register_series_accessor("batchsum")(SeriesAccessor)
