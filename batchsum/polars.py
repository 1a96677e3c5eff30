"""``df.batchsum`` and ``series.batchsum`` for Polars, registered through Polars' own namespace API
by ``import batchsum.polars`` (extra ``polars``).

Arrow in and out: the text column leaves Polars as an Arrow array and the result columns come back
as Arrow arrays (``pl.String``, ``pl.Int32``), with no pandas in between. The same run as every other
front-end (``run.Run``): the same options, budget, journal and answers; the synchronous calls run on a
worker thread's event loop, so they work inside a running loop (Jupyter) too. A Polars frame has no
``attrs``: the run's record (its account and timeline, what ``batchsum.plot_run`` draws) is
``batchsum.polars.last_run()``.

A ``LazyFrame`` (``pl.scan_parquet(...)``) has the namespace too: ``lf.batchsum.summarize("text")`` is
a LazyFrame whose collecting or sinking streams the input's batches through one run
(``batches.BatchStream``) in bounded memory, with the eager frame's answers.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

try:
    import polars as pl
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("batchsum.polars needs Polars: pip install 'batchsum[polars]'") from exc

import pyarrow as pa
from polars.io.plugins import register_io_source

from ._frame_accessor import ColumnSummarize, ColumnSummarizeAsync, ValuesSummarize, ValuesSummarizeAsync
from .data.results import RowBlocks, RowResult, arrow_columns, arrow_types, check_columns, result_columns
from .data.stores import scratch_store
from .engine.tally import BatchStats
from .run.background import run_in_worker
from .run.batches import BatchStream
from .run.run import run_texts
from .run.spec import RunSpec
from .service.errors import InputError

__all__ = ["DataFrameNamespace", "LazyFrameNamespace", "SeriesNamespace", "last_run", "LAZY_BATCH_ROWS"]

LAZY_BATCH_ROWS = 10_000  # rows a LazyFrame's input is read in, when Polars does not say

_last = threading.local()


def last_run() -> dict[str, Any] | None:
    """The record of this thread's last Polars run: its account and timeline (``plot_run`` draws it)."""
    record: dict[str, Any] | None = getattr(_last, "record", None)
    return record


class _Namespace:
    """A Polars DataFrame's or Series' texts in (through Arrow), the result columns out."""

    def __init__(self, data: pl.DataFrame | pl.Series) -> None:
        self._data = data

    def _texts(self, column: Hashable, spec: RunSpec) -> RowBlocks:
        if isinstance(self._data, pl.Series):
            return self._texts_of(self._data)
        check_columns(self._data.columns, column, spec.output_column)
        if not isinstance(column, str):
            raise InputError(f"no column {column!r} in the DataFrame: Polars columns are named by text")
        return self._texts_of(self._data.get_column(column))

    @staticmethod
    def _texts_of(series: pl.Series) -> RowBlocks:
        # Through Arrow, a block at a time; a value that is not text is skipped per row by the run,
        # as on every front-end.
        # A pl.Object column holds Python objects, which Arrow would turn into bytes: its values are
        # taken as they are (strings read as text; anything else is failed per row).
        as_objects = series.dtype == pl.Object

        def take(start: int, stop: int) -> list[Any]:
            block = series.slice(start, stop - start)
            values: list[Any] = block.to_list() if as_objects else block.to_arrow().to_pylist()
            return values

        return RowBlocks(len(series), take)

    def _frame(self, results: list[RowResult], spec: RunSpec, stats: BatchStats) -> pl.DataFrame:
        _last.record = stats.record()
        names = result_columns(spec.output_column)
        table = pa.Table.from_arrays(arrow_columns(results), names=names)
        out = pl.from_arrow(table)
        assert isinstance(out, pl.DataFrame)
        if isinstance(self._data, pl.Series):
            return out
        return self._data.hstack(out)

    def _summarize(self, column: Hashable, spec: RunSpec) -> pl.DataFrame:
        texts, stats = self._texts(column, spec), BatchStats()
        return self._frame(run_in_worker(lambda: run_texts(spec, texts, stats=stats, warn_at_cap=True)), spec, stats)

    async def _asummarize(self, column: Hashable, spec: RunSpec) -> pl.DataFrame:
        texts, stats = self._texts(column, spec), BatchStats()
        return self._frame(await run_texts(spec, texts, stats=stats, warn_at_cap=True), spec, stats)


@pl.api.register_dataframe_namespace("batchsum")
class DataFrameNamespace(_Namespace, ColumnSummarize[pl.DataFrame], ColumnSummarizeAsync[pl.DataFrame]):
    """``df.batchsum.summarize("text", ...)``: a new Polars DataFrame, every column of ``df`` then the
    result columns (``pl.String`` and ``pl.Int32``), rows in order."""


@pl.api.register_series_namespace("batchsum")
class SeriesNamespace(_Namespace, ValuesSummarize[pl.DataFrame], ValuesSummarizeAsync[pl.DataFrame]):
    """``series.batchsum.summarize(...)``: the result columns as a Polars DataFrame, one row per value."""


@pl.api.register_lazyframe_namespace("batchsum")
class LazyFrameNamespace(ColumnSummarize[pl.LazyFrame]):
    """``lf.batchsum.summarize("text", ...)``: a LazyFrame, every column of ``lf`` then the result
    columns, rows in order. Nothing is sent until it is collected or sunk (``collect()``,
    ``sink_parquet(...)``); then the input is read a batch at a time (``collect_batches``) and
    streamed through one run, so memory stays bounded however large the input: unless ``journal``
    names one, its answers are kept in a journal on disk for this process (removed at exit), not in
    memory, and collecting again pays for nothing. A ``head(n)`` after it reads (and pays for) only
    ``n`` rows; a filter after it is applied to the results."""

    def __init__(self, data: pl.LazyFrame) -> None:
        self._data = data

    def _summarize(self, column: Hashable, spec: RunSpec) -> pl.LazyFrame:
        data = self._data
        schema = data.collect_schema()
        check_columns(schema.names(), column, spec.output_column)
        if not isinstance(column, str):
            raise InputError(f"no column {column!r} in the LazyFrame: Polars columns are named by text")
        text_column: str = column
        if spec.store == "none":  # answers on disk, with claims, not in memory: it may be larger than memory
            spec = spec.replace(store=scratch_store())
        kinds = pl.from_arrow(pa.schema(list(zip(result_columns(spec.output_column), arrow_types()))).empty_table())
        assert isinstance(kinds, pl.DataFrame)
        out_schema = {**dict(schema), **dict(kinds.schema)}

        def source(
            with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None, batch_size: int | None
        ) -> Any:
            frame = data if n_rows is None else data.head(n_rows)
            batches = (
                batch
                for chunk in frame.collect_batches(chunk_size=batch_size or LAZY_BATCH_ROWS)
                for batch in chunk.to_arrow().to_batches()
            )
            for done in BatchStream(spec, batches, text_column, shared=False):
                out = pl.from_arrow(done)
                assert isinstance(out, pl.DataFrame)
                if predicate is not None:
                    out = out.filter(predicate)
                yield out.select(with_columns) if with_columns is not None else out

        return register_io_source(source, schema=out_schema, explain_name="batchsum_summarize")
