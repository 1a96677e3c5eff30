"""``df.batchsum`` and ``series.batchsum`` for Polars, registered through Polars' own namespace API
by ``import batchsum.polars`` (extra ``polars``).

The text column leaves Polars as an Arrow array (a LazyFrame's as Python values) and the result
columns are made by Polars from the results (``pl.String``, ``pl.Int32``), with no pandas in between:
an Arrow array made from Python values would load pandas, 40 MB, only to ask whether they are pandas
objects. The same run as every other
front-end (``run.Run``): the same options, budget, journal and answers; the synchronous calls run on a
worker thread's event loop, so they work inside a running loop (Jupyter) too. A Polars frame has no
``attrs``: the run's record (its account and timeline, what ``batchsum.plot_run`` draws) is
``batchsum.polars.last_run()``.

A ``LazyFrame`` (``pl.scan_parquet(...)``) has the namespace too: ``lf.batchsum.summarize("text")`` is
a LazyFrame whose collecting or sinking streams the input's batches through one run
(``batches.BatchStream``) in bounded memory, with the eager frame's answers, with neither pyarrow nor
pandas loaded. Its plan holds no secret: the key stays in this process (``_keep``), and a plan run
in another process reads the key from that process's environment. SIGINT while it is collected
(Ctrl-C, a notebook's stop) stops the run: Polars runs the source on threads of its own while the
main thread waits in Polars' code, so the signal is heard on its behalf (``run.interrupts``); the
answers on the wire are awaited and kept, and the collect raises ``KeyboardInterrupt``, once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import uuid
from collections.abc import Hashable
from typing import Any

try:
    import polars as pl
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("batchsum.polars needs Polars: pip install 'batchsum[polars]'") from exc

from polars.io.plugins import register_io_source

from ._frame_accessor import ColumnSummarize, ColumnSummarizeAsync, ValuesSummarize, ValuesSummarizeAsync
from .data.results import RowBlocks, RowResult, check_columns, result_columns
from .data.stores import scratch_store
from .engine.tally import BatchStats
from .run.background import run_in_worker
from .run.batches import BatchStream
from .run.interrupts import listen, on_interrupt
from .run.run import run_texts
from .run.spec import RunSpec
from .service.errors import ConfigurationError, InputError, RunInterrupted, redact_location
from .service.key_plans import ENV_API_KEYS, KeyPlan, resolve_keys
from .service.location import Location
from .service.settings import ENV_API_KEY, Secret, environment

__all__ = ["DataFrameNamespace", "LazyFrameNamespace", "SeriesNamespace", "last_run", "LAZY_BATCH_ROWS"]

LAZY_BATCH_ROWS = 2048  # rows of a LazyFrame's input handed to the run at a time (Polars' chunks are cut to it)
# The result columns' Polars types: what ``data.results.arrow_types`` are in Arrow (string x4, int32 x3).
_RESULT_TYPES: tuple[type[pl.DataType], ...] = (
    pl.String,
    pl.String,
    pl.String,
    pl.String,
    pl.Int32,
    pl.Int32,
    pl.Int32,
)

_last = threading.local()


def last_run() -> dict[str, Any] | None:
    """The record of this thread's last Polars run: its account and timeline (``plot_run`` draws it)."""
    record: dict[str, Any] | None = getattr(_last, "record", None)
    return record


# A lazy plan's secrets by token, kept in the process that made the plan (and the token by secrets,
# so that a process making many plans with one key keeps it once).
_Secrets = tuple[Secret | None, str, Any, Location, tuple[KeyPlan, ...]]
_kept: dict[str, _Secrets] = {}
_tokens: dict[_Secrets, str] = {}
_kept_lock = threading.Lock()


def _keep(spec: RunSpec) -> tuple[RunSpec, str]:
    """``spec`` without its secrets (its keys; the credentials in its base URL, budget or answer
    store), and the opaque token this process keeps them under: what a lazy plan holds, so that no
    serialized, explained or printed plan holds a piece of them."""
    secrets: _Secrets = (spec.client.api_key, spec.client.base_url, spec.budget, spec.store, spec.keys)
    with _kept_lock:
        try:
            token = _tokens.get(secrets)
        except TypeError:  # a budget object that cannot be a key: kept once per plan
            token = None
        if token is None:
            token = uuid.uuid4().hex
            _kept[token] = secrets
            with contextlib.suppress(TypeError):
                _tokens[secrets] = token
    budget = spec.budget.without_secrets() if isinstance(spec.budget, Location) else spec.budget
    client = dataclasses.replace(spec.client, api_key=None, base_url=redact_location(spec.client.base_url))
    return spec.replace(client=client, budget=budget, store=spec.store.without_secrets(), keys=()), token


def _kept_spec(bare: RunSpec, token: str) -> RunSpec:
    """The spec a lazy plan runs with, where it runs: in the process that made the plan, its secrets
    as kept; in another one (a plan serialized and loaded there), the keys from that process's
    environment (``$BATCHSUM_API_KEYS``, else ``$BATCHSUM_API_KEY``), and no other secret (a base URL,
    budget or store that held credentials is refused)."""
    with _kept_lock:
        secrets = _kept.get(token)
    if secrets is not None:
        key, base_url, budget, store, keys = secrets
        client = dataclasses.replace(bare.client, api_key=key, base_url=base_url)
        return bare.replace(client=client, budget=budget, store=store, keys=keys)
    elsewhere = "this lazy plan was made in another process, which kept its"
    for name, value in (("base URL", bare.client.base_url), ("budget", bare.budget), ("store", bare.store)):
        if (isinstance(value, str) and "***" in value) or (isinstance(value, Location) and value.withheld):
            raise ConfigurationError(f"{elsewhere} {name}'s credentials: collect it in the process that made it")
    if bare.client.local:
        return bare
    here = resolve_keys(None, None, environment())
    if not here:
        raise ConfigurationError(f"{elsewhere} key: set {ENV_API_KEY} (or {ENV_API_KEYS}) where the plan runs")
    return bare.replace(client=dataclasses.replace(bare.client, api_key=here[0].key), keys=here)


def _results_frame(results: list[RowResult], output_column: str) -> pl.DataFrame:
    """The results as a Polars frame of the result columns (built by Polars from the values: no
    Arrow conversion of Python values, which would load pandas into the process)."""
    columns: list[tuple[Any, ...]] = list(zip(*results)) if results else [() for _ in RowResult._fields]
    names = result_columns(output_column)
    return pl.DataFrame(
        [pl.Series(name, values, dtype=kind) for name, values, kind in zip(names, columns, _RESULT_TYPES)]
    )


class _Frames:
    """A LazyFrame's input chunks as ``BatchStream`` reads them: the texts of ``column`` as Python
    values (straight from Polars), the result columns appended as Polars columns."""

    def __init__(self, column: str, output_column: str) -> None:
        self.column, self.output_column = column, output_column

    def texts(self, frame: pl.DataFrame) -> list[Any]:
        return frame.get_column(self.column).to_list()

    def with_results(self, frame: pl.DataFrame, results: list[RowResult]) -> pl.DataFrame:
        return frame.hstack(_results_frame(results, self.output_column))


class _Source:
    """A lazy plan's source (``register_io_source``): its input read a batch at a time and streamed
    through one run. Polars calls it on the thread that collects, which then waits in Polars while
    Polars' threads read the batches; on the main thread, SIGINT's one ``KeyboardInterrupt`` is the
    collect's (``interrupts``)."""

    def __init__(self, data: pl.LazyFrame, bare: RunSpec, token: str, frames: _Frames) -> None:
        self.data, self.bare, self.token, self.frames = data, bare, token, frames

    def __call__(
        self, with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None, batch_size: int | None
    ) -> Any:
        main_waits = threading.current_thread() is threading.main_thread()
        if main_waits:
            listen()
        frame = self.data if n_rows is None else self.data.head(n_rows)
        return self._batches(
            frame, with_columns, predicate, min(batch_size or LAZY_BATCH_ROWS, LAZY_BATCH_ROWS), main_waits
        )

    def _batches(
        self,
        frame: pl.LazyFrame,
        with_columns: list[str] | None,
        predicate: pl.Expr | None,
        rows: int,
        main_waits: bool,
    ) -> Any:
        # Polars' chunks follow the input (a Parquet row group can be 100,000 rows): each is cut into
        # slices of ``rows`` (views, no copy), so that what the run holds stays small.
        chunks = (
            chunk.slice(start, rows)
            for chunk in frame.collect_batches(chunk_size=rows)
            for start in range(0, chunk.height, rows)
        )
        spec = _kept_spec(self.bare, self.token)
        stream = BatchStream(spec, chunks, self.frames.column, shared=False, frames=self.frames)
        try:
            with on_interrupt(stream.cancel, main_waits=main_waits):  # the collect's wait hears no signal itself
                for out in stream:
                    if predicate is not None:
                        out = out.filter(predicate)
                    yield out.select(with_columns) if with_columns is not None else out
        except RunInterrupted as exc:  # the collect raises what Python raises for a signal
            raise KeyboardInterrupt(str(exc)) from exc


class _Namespace:
    """A Polars DataFrame's or Series' texts in (through Arrow), the result columns out."""

    door = "polars"

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
        out = _results_frame(results, spec.output_column)
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
    streamed through one run, so memory stays bounded however large the input: its answers go to the
    machine's answer store on disk (with ``store="none"``, a store on disk for this process, removed at
    exit), not to memory, and collecting again (or another lazy frame at once) pays for nothing. A ``head(n)`` after it reads (and pays for) only
    ``n`` rows; a filter after it is applied to the results."""

    door = "polars"

    def __init__(self, data: pl.LazyFrame) -> None:
        self._data = data

    def _summarize(self, column: Hashable, spec: RunSpec) -> pl.LazyFrame:
        data = self._data
        schema = data.collect_schema()
        check_columns(schema.names(), column, spec.output_column)
        if not isinstance(column, str):
            raise InputError(f"no column {column!r} in the LazyFrame: Polars columns are named by text")
        if spec.store.none:  # answers on disk, with claims, not in memory: it may be larger than memory
            spec = spec.replace(store=scratch_store())
        out_schema: dict[str, Any] = {**dict(schema), **dict(zip(result_columns(spec.output_column), _RESULT_TYPES))}
        frames = _Frames(column, spec.output_column)
        bare, token = _keep(spec)  # what the plan holds: the spec without its secrets
        listen()  # SIGINT heard while a collect runs in Polars' threads (on the main thread's behalf)
        source = _Source(data, bare, token, frames)
        return register_io_source(source, schema=out_schema, explain_name="batchsum_summarize")
