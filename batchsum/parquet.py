"""Parquet in and out, streamed: inputs (files, folders, globs) read in record batches; one output
file with every input column plus the result columns, in input order, written as rows finish to a
temporary name and renamed into place only when the run is complete."""

from __future__ import annotations

import glob
import os
import tempfile
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .engine import RowResult, result_columns, summarize_stream
from .errors import InputError, JournalError

__all__ = ["ParquetInput", "ParquetOutput", "summarize_parquet", "resolve_inputs", "check_output_path", "BATCH_ROWS"]

BATCH_ROWS = 1024

_RESULT_TYPES = [pa.string(), pa.string(), pa.string(), pa.string(), pa.int32(), pa.int32()]


def resolve_inputs(specs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Files in order: a file as given, a folder's ``*.parquet`` (recursively, sorted), a glob's matches."""
    paths: list[Path] = []
    for spec in specs:
        text = os.fspath(spec)
        path = Path(text)
        if any(c in text for c in "*?[") and not path.exists():
            found = [Path(p) for p in sorted(glob.glob(text, recursive=True)) if Path(p).is_file()]
            if not found:
                raise InputError(f"no file matches {text!r}")
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*.parquet") if p.is_file())
            if not found:
                raise InputError(f"folder {text} holds no .parquet files")
        elif path.is_file():
            found = [path]
        else:
            raise InputError(f"{text}: no such file or folder")
        paths.extend(p for p in found if p not in paths)
    if not paths:
        raise InputError("no input given")
    return paths


def _is_text(arrow_type: pa.DataType) -> bool:
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_null(arrow_type)


class ParquetInput:
    """One or more Parquet files of the same schema, read as a stream of record batches."""

    def __init__(self, specs: Sequence[str | os.PathLike[str]], column: str) -> None:
        self.paths = resolve_inputs(specs)
        self.column = column
        self.num_rows = 0
        self.schema: pa.Schema | None = None
        for path in self.paths:
            if path.stat().st_size == 0:
                raise InputError(f"{path} is empty (0 bytes), not a Parquet file")
            try:
                metadata = pq.read_metadata(path)
                schema = metadata.schema.to_arrow_schema()
            except (pa.ArrowException, OSError) as exc:
                raise InputError(f"{path} cannot be read as Parquet: {exc}") from None
            if self.schema is None:
                self.schema = schema
                if column not in schema.names:
                    raise InputError(
                        f"no column {column!r} in {path}; its columns are: {', '.join(schema.names)}"
                    )
                if not _is_text(schema.field(column).type):
                    raise InputError(
                        f"column {column!r} in {path} holds {schema.field(column).type}, not text"
                    )
            elif not schema.remove_metadata().equals(self.schema.remove_metadata()):
                raise InputError(f"{path} has other columns or types than {self.paths[0]}; inputs must match")
            self.num_rows += metadata.num_rows
        if self.num_rows == 0:
            raise InputError(f"{', '.join(map(str, self.paths))}: no rows to summarize")

    def batches(self, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        for path in self.paths:
            with pq.ParquetFile(path) as parquet_file:
                yield from parquet_file.iter_batches(batch_size=batch_rows)

    def texts(self, batch_rows: int = BATCH_ROWS) -> Iterator[Any]:
        for batch in self.batches(batch_rows):
            yield from batch.column(self.column).to_pylist()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_output_path(path: str | os.PathLike[str], inputs: Sequence[Path] = ()) -> Path:
    """The output path, when a file can be written there; else an ``InputError`` saying why."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"output {path} is a folder; give a file name")
    if not path.parent.is_dir():
        raise InputError(f"cannot write {path}: folder {path.parent} does not exist")
    if any(path.resolve() == p.resolve() for p in inputs):
        raise InputError(f"output {path} is also an input; write to another file")
    return path


class ParquetOutput:
    """The output file, written batch by batch to a temporary file of its own beside it (created
    exclusively, a unique name per run) and renamed into place when complete."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        input_schema: pa.Schema,
        output_column: str = "summary",
        inputs: Sequence[Path] = (),
    ) -> None:
        self.path = check_output_path(path, inputs)
        names = result_columns(output_column)
        clash = [n for n in names if n in input_schema.names]
        if clash:
            raise InputError(
                f"the input already has column {clash[0]!r}; choose another name with --output-column"
            )
        self.schema = input_schema
        for name, arrow_type in zip(names, _RESULT_TYPES):
            self.schema = self.schema.append(pa.field(name, arrow_type))
        try:
            fd, name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".partial", dir=self.path.parent)
        except OSError as exc:
            raise InputError(f"cannot write {self.path}: {exc.strerror} in folder {self.path.parent}") from None
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it private; the output is an ordinary file
        self.partial = Path(name)
        self._file = os.fdopen(fd, "wb")
        self._writer = pq.ParquetWriter(self._file, self.schema)

    def write(self, batch: pa.RecordBatch, results: Sequence[RowResult]) -> None:
        columns = list(zip(*results)) if results else [[] for _ in _RESULT_TYPES]
        arrays = batch.columns + [pa.array(values, type=t) for values, t in zip(columns, _RESULT_TYPES)]
        self._writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self.schema))

    def commit(self) -> None:
        self._writer.close()
        self._file.close()
        os.replace(self.partial, self.path)

    def abort(self) -> None:
        if not self._file.closed:
            self._writer.close()
            self._file.close()
        self.partial.unlink(missing_ok=True)


async def summarize_parquet(
    source: ParquetInput, output: ParquetOutput, client: Any, *args: Any, batch_rows: int = BATCH_ROWS, **engine: Any
) -> None:
    """Stream ``source`` through the engine into ``output``; ``engine`` goes to ``summarize_stream``.

    Input batches are held only until their rows' results arrive, so memory stays bounded.
    On an interrupt or a refused key the partial output is removed (finished answers stay in the
    store, and the same command resumes). When the journal cannot be written, the rows finished so far
    are written to the output, since some of their answers may be nowhere else, and the error raised.
    """
    held: deque[pa.RecordBatch] = deque()
    column = source.column

    def texts() -> Iterator[Any]:
        for batch in source.batches(batch_rows):
            held.append(batch)
            yield from batch.column(column).to_pylist()

    finished: list[RowResult] = []
    try:
        async for result in summarize_stream(texts(), client, *args, **engine):
            finished.append(result)
            while held and len(finished) >= held[0].num_rows:
                batch = held.popleft()
                output.write(batch, finished[: batch.num_rows])
                del finished[: batch.num_rows]
        while held:  # batches of no rows
            output.write(held.popleft(), [])
    except JournalError:
        if finished and held:
            output.write(held[0].slice(0, len(finished)), finished)
        output.commit()
        raise
    except BaseException:
        output.abort()
        raise
    output.commit()
