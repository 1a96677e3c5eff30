"""The result record of one row, its columns and their types, and shaping results into frames.

Every front-end writes the same columns with the same types: ``summary``, ``summary_status``,
``summary_error``, ``summary_message``, ``summary_http_status``, ``summary_attempts``,
``summary_requests`` (named after the output column), as pandas' string / Int32 / int32 dtypes and
Arrow's string / int32.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ..service.errors import InputError

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

ArrowT = TypeVar("ArrowT", "pa.RecordBatch", "pa.Table")

__all__ = [
    "RowBlock",
    "RowBlocks",
    "column_blocks",
    "RowResult",
    "Answer",
    "OK",
    "SKIPPED",
    "FAILED",
    "RESULT_DTYPES",
    "result_columns",
    "result_dtypes",
    "arrow_types",
    "arrow_columns",
    "with_results",
    "check_columns",
    "check_output_columns",
    "results_frame",
    "join_results",
]

OK = "ok"
SKIPPED = "skipped"
FAILED = "failed"


BLOCK_ROWS = 1024  # rows taken at once from a list or a column (looked up in bulk)


@dataclass(slots=True)
class RowBlock:
    """Rows read together (an input's record batch): their texts, looked up in bulk, and the input's
    bytes they stand for, which the window holds while any of them waits (``RunOptions.window_bytes``)."""

    texts: list[Any]
    nbytes: int = 0


class RowBlocks:
    """A column's values as ``RowBlock``s, taken ``rows`` at a time (``take(start, stop)`` gives them
    as a list): a front-end's frame column goes through a run without ever being held whole as
    Python objects. ``len()`` is the number of values."""

    def __init__(self, count: int, take: Callable[[int, int], list[Any]], rows: int = BLOCK_ROWS) -> None:
        self.count, self.take, self.rows = count, take, rows

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[RowBlock]:
        for start in range(0, self.count, self.rows):
            texts = self.take(start, min(self.count, start + self.rows))
            yield RowBlock(texts, sum(len(text) for text in texts if type(text) is str))


class RowResult(NamedTuple):
    """The result of one input row."""

    summary: str | None
    status: str  # "ok" | "skipped" | "failed"
    error: str | None  # None, a skip reason, or an error code (errors.APIError.code)
    message: str | None  # the service's words, or ours
    http_status: int | None
    attempts: int  # attempts the service answered (paid), over all the row's requests
    requests: int = 1  # requests the row's answer is made of: 1, 0 when skipped, more for a long text


class Answer(NamedTuple):
    """What an answer store keeps per request fingerprint: a summary, or a permanent refusal."""

    summary: str | None
    status: str
    error: str | None
    message: str | None
    http_status: int | None
    attempts: int

    def row(self, requests: int = 1, message: str | None = None) -> RowResult:
        """The row result this answer gives (``message``: ours, in place of the service's none)."""
        summary, status, error, own, http_status, attempts = self
        return RowResult(summary, status, error, message or own, http_status, attempts, requests)


# The result columns' pandas dtypes, the same on every path (accessor, Dask, Parquet read back):
# text as pandas' string dtype (missing: pd.NA), the HTTP status nullable (skipped rows have none).
RESULT_DTYPES = ("string", "string", "string", "string", "Int32", "int32", "int32")


def result_columns(output_column: str = "summary") -> list[str]:
    """Column names of a ``RowResult``, named after the output column."""
    return [output_column] + [f"{output_column}_{name}" for name in RowResult._fields[1:]]


def result_dtypes(output_column: str = "summary") -> dict[str, str]:
    """``{column: dtype}`` of the result columns, e.g. for ``pd.read_csv(path, dtype=...)``."""
    return dict(zip(result_columns(output_column), RESULT_DTYPES))


def arrow_types() -> list[pa.DataType]:
    """The result columns' Arrow types: string x4, int32 x3."""
    import pyarrow as pa

    return [pa.string(), pa.string(), pa.string(), pa.string(), pa.int32(), pa.int32(), pa.int32()]


def arrow_columns(results: Sequence[RowResult]) -> list[pa.Array]:
    """The results as one Arrow array per result column. A column holding one value throughout (a
    rerun's statuses, codes and counts, nearly always) is a slice of that value repeated, made once."""
    import pyarrow as pa

    if not results:
        return [pa.array([], type=t) for t in arrow_types()]
    arrays = []
    for values, arrow_type in zip(zip(*results), arrow_types()):
        first = values[0]
        short = first is None or type(first) is int or (type(first) is str and len(first) <= 64)
        if short and values.count(first) == len(values):  # compared at C speed, by identity first
            arrays.append(_repeated(first, arrow_type, len(values)))
        else:
            arrays.append(pa.array(values, type=arrow_type))
    return arrays


_REPEATED: dict[tuple[object, str], pa.Array] = {}  # (value, type) -> the value repeated, sliced for each use


def _repeated(value: object, arrow_type: pa.DataType, count: int) -> pa.Array:
    """``value`` (a short one) ``count`` times as an Arrow array: a zero-copy slice of one made once
    (again when a longer one is needed). Such values are few (``ok``, 200, 1, a skip's code, no value)
    and at most 64 are kept."""
    import pyarrow as pa

    key = (value, str(arrow_type))
    made = _REPEATED.get(key)
    if made is None or len(made) < count:
        length = max(count, 4096)
        made = pa.nulls(length, arrow_type) if value is None else pa.repeat(pa.scalar(value, arrow_type), length)
        if len(_REPEATED) < 64 or key in _REPEATED:
            _REPEATED[key] = made
    return made.slice(0, count)


def with_results(batch: ArrowT, results: Sequence[RowResult], output_column: str) -> ArrowT:
    """``batch`` (an Arrow record batch or table) with the result columns of its rows appended."""
    for name, values in zip(result_columns(output_column), arrow_columns(results)):
        batch = batch.append_column(name, values)
    return batch


def check_output_columns(columns: Any, output_column: str, hint: str = "output_column='...'") -> None:
    """None of the result columns is among ``columns`` already."""
    clash = [name for name in result_columns(output_column) if name in columns]
    if clash:
        raise InputError(f"the input already has column {clash[0]!r}; pass {hint} to name the results")


def check_columns(columns: Any, column: Hashable, output_column: str) -> None:
    """The text column is there and the result columns are not (a pandas, Dask or Polars frame's columns)."""
    if column not in columns:
        shown = ", ".join(map(repr, list(columns)[:20]))
        raise InputError(f"no column {column!r} in the DataFrame; its columns are: {shown}")
    check_output_columns(columns, output_column)


def column_blocks(series: pd.Series) -> RowBlocks:
    """A pandas Series' values for a run, a block at a time: never all of them as Python objects at once."""
    return RowBlocks(len(series), lambda start, stop: series.iloc[start:stop].tolist())


def results_frame(results: Sequence[RowResult], index: pd.Index, output_column: str) -> pd.DataFrame:
    """The result columns as a pandas DataFrame on ``index``, with ``RESULT_DTYPES``."""
    import pandas as pd

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


def join_results(frame: pd.DataFrame, results: Sequence[RowResult], output_column: str) -> pd.DataFrame:
    """A copy of ``frame`` (the first ``len(results)`` rows) with the result columns after its own."""
    out: pd.DataFrame = frame.copy()
    for name, values in results_frame(results, frame.index, output_column).items():
        out[name] = values.array  # positional: no index alignment, dtype kept
    return out
