"""The inputs: one or more Arrow datasets of one schema, read as a stream of record batches in
order, local Parquet through ``pyarrow.parquet``, the rest through ``pyarrow.dataset``."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

if TYPE_CHECKING:
    import pyarrow.dataset as ds

from ..service.errors import BrokenInputError, InputError, one_line
from .locations import INPUT_FORMATS, Source, input_error, resolve

__all__ = ["DatasetInput", "BATCH_ROWS", "BATCH_BYTES"]

BATCH_ROWS = 1024  # rows read at once, at most ...
BATCH_BYTES = 2 << 20  # ... and fewer when the rows are wide: about this many bytes (Parquet's own sizes)


_NAMES = {"parquet": "Parquet", "csv": "CSV", "jsonl": "JSON Lines"}


def _unreadable(what: str, format: str, exc: BaseException, *specs: str) -> InputError:
    """ "X cannot be read as Parquet: <pyarrow's reason, without its preamble>"."""
    reason = one_line(exc)
    if "magic bytes not found" in reason:
        reason = "not a Parquet file (no Parquet footer)"
    else:
        reason = reason.rsplit("?: ", 1)[-1].rsplit("': ", 1)[-1]
    return input_error(f"{what} cannot be read as {_NAMES.get(format, format)}: {reason}", what, *specs)


def _dataset_module() -> Any:
    """``pyarrow.dataset``, imported when an input needs it (a CSV or JSON Lines file, hive
    partitions, a remote file): importing it imports pandas too, which a plain Parquet run does not need."""
    import pyarrow.dataset

    return pyarrow.dataset


def _file_format(format: str, column: str) -> ds.FileFormat:
    ds = _dataset_module()
    if format == "parquet":
        return ds.ParquetFileFormat()
    if format == "csv":  # the text column is text, whatever it looks like
        return ds.CsvFileFormat(convert_options=pcsv.ConvertOptions(column_types={column: pa.string()}))
    if format == "jsonl":
        options = pjson.ParseOptions(
            explicit_schema=pa.schema([(column, pa.string())]), unexpected_field_behavior="infer"
        )
        return ds.JsonFileFormat(parse_options=options)
    raise InputError(f"unknown format {format!r}: use parquet, csv or jsonl")


def _is_text(arrow_type: pa.DataType) -> bool:
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return bool(pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_null(arrow_type))


def _partitioned(source: Source) -> bool:
    """Does a folder input have ``key=value`` sub-folders (hive partitions, which become columns)?"""
    if source.base is None:
        return False
    base = PurePosixPath(source.base.replace(os.sep, "/"))
    return any(
        "=" in part
        for path in source.files
        for part in PurePosixPath(path.replace(os.sep, "/")).relative_to(base).parts[:-1]
    )


class _ParquetFiles:
    """Local Parquet files with no partition columns, read with ``pyarrow.parquet`` directly, a
    record batch at a time: memory stays bounded by the batch, not by the file's row groups (a
    dataset scan decodes a whole row group ahead), and ``pyarrow.dataset`` is never imported."""

    def __init__(self, source: Source) -> None:
        self.paths = source.files
        self.where = source.spec  # the file being read
        self.files: list[pq.ParquetFile] = []
        self._ahead: list[_ReadAhead] = []
        for path in source.files:
            try:
                self.files.append(pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20))
            except (pa.ArrowException, OSError, ValueError) as exc:
                self.close()
                raise _unreadable(path, "parquet", exc, source.spec) from None
        self.schema = self.files[0].schema_arrow
        for path, file in zip(source.files, self.files):
            if not file.schema_arrow.remove_metadata().equals(self.schema.remove_metadata()):
                self.close()
                raise input_error(
                    f"{path} has other columns or types than {source.files[0]}; inputs must match", source.spec
                )

    def count_rows(self) -> int:
        return sum(file.metadata.num_rows for file in self.files)

    def row_bytes(self) -> float:
        """The rows' mean width, uncompressed, from the files' own statistics."""
        size = sum(
            file.metadata.row_group(i).total_byte_size for file in self.files for i in range(file.num_row_groups)
        )
        return float(size) / max(1, self.count_rows())

    def batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """The rows ``batch_rows`` at a time, decoded ahead on a thread of their own (``_ReadAhead``)."""
        ahead = _ReadAhead(self._each_batch(batch_rows))
        self._ahead.append(ahead)
        return iter(ahead)

    def _each_batch(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        for path, file in zip(self.paths, self.files):
            self.where = path
            yield from file.iter_batches(batch_size=batch_rows, use_threads=False)

    def close(self) -> None:
        for ahead in self._ahead:  # no thread reads a file as it is closed
            ahead.close()
        for file in self.files:
            file.close()


READ_AHEAD_BATCHES = 4  # batches a local Parquet input's read-ahead hands over at once (one lot ready, one in use)


class _ReadAhead:
    """Record batches decoded on a thread of their own, a lot of ``READ_AHEAD_BATCHES`` ahead of the
    lot in use (pyarrow lets the GIL go while it decodes), so that reading the file and working on its
    rows go on at once; handed over by the lot, so that the two threads meet once a lot, not once a
    batch. An error is raised where its batch would have come, after the batches before it;
    ``close()`` (and the end of the iteration, however it ends) stops the thread before it returns."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._ready: queue.Queue[tuple[list[pa.RecordBatch], BaseException | None, bool]] = queue.Queue(1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        self._thread = threading.Thread(target=self._read, name="batchsum-read", daemon=True)
        self._thread.start()
        try:
            while True:
                lot, error, last = self._ready.get()
                yield from lot
                if error is not None:
                    raise error
                if last:
                    return
        finally:
            self.close()

    def _read(self) -> None:
        lot: list[pa.RecordBatch] = []
        try:
            for batch in self._batches:
                lot.append(batch)
                if len(lot) == READ_AHEAD_BATCHES:
                    if not self._put((lot, None, False)):
                        return
                    lot = []
            self._put((lot, None, True))
        except BaseException as exc:  # noqa: BLE001 - raised in the thread that reads the batches
            self._put((lot, exc, True))

    def _put(self, item: tuple[list[pa.RecordBatch], BaseException | None, bool]) -> bool:
        """Hand ``item`` over, waiting for room; False when the reading stopped first."""
        while not self._stop.is_set():
            try:
                self._ready.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()


class _Scanned:
    """An input read through ``pyarrow.dataset``: CSV, JSON Lines, hive partitions, remote files."""

    def __init__(self, source: Source, column: str) -> None:
        ds = _dataset_module()
        try:
            self.dataset = ds.dataset(
                source.files,
                filesystem=source.filesystem,
                format=_file_format(source.format, column),
                partitioning="hive" if source.base is not None else None,
                partition_base_dir=source.base,
            )
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise _unreadable(source.spec, source.format, exc) from None
        self.schema = self.dataset.schema
        self.format = source.format
        self.where = source.spec  # the file being read

    def count_rows(self) -> int:
        return int(self.dataset.count_rows())

    def row_bytes(self) -> float | None:
        return None

    def batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        ds = _dataset_module()
        options = (
            {"fragment_scan_options": ds.ParquetFragmentScanOptions(pre_buffer=False)}
            if self.format == "parquet"
            else {}
        )
        for fragment in sorted(self.dataset.get_fragments(), key=lambda fragment: fragment.path):
            # One batch and one file read ahead, and no whole-row-group prefetch.
            scanner = ds.Scanner.from_fragment(
                fragment,
                schema=self.dataset.schema,
                batch_size=batch_rows,
                batch_readahead=1,
                fragment_readahead=1,
                **options,
            )
            self.where = fragment.path
            yield from scanner.to_batches()

    def close(self) -> None:
        pass


class DatasetInput:
    """One or more inputs of one schema (files, folders, globs, remote URIs), read as a stream of
    record batches in order. ``num_rows`` is None when counting would mean reading a remote CSV or
    JSON file twice.

    Local Parquet files are read with ``pyarrow.parquet`` directly (``_ParquetFiles``), everything
    else through ``pyarrow.dataset``. Batches hold at most ``BATCH_ROWS`` rows, fewer when the rows
    are wide (about ``BATCH_BYTES``, where the files say how wide)."""

    def __init__(self, specs: Sequence[str | os.PathLike[str]], column: str, *, format: str | None = None) -> None:
        if not specs:
            raise InputError("no input given")
        if format is not None and format not in INPUT_FORMATS:
            raise InputError(f"unknown --format {format!r}: use parquet, csv or jsonl")
        self.column = column
        self.sources = [resolve(os.fspath(spec), format) for spec in specs]
        self.paths = [Path(f) for s in self.sources if not s.remote for f in s.files]  # local files, to guard
        self.uris = [s.spec for s in self.sources]
        self.readers: list[_ParquetFiles | _Scanned] = []
        self.schema: pa.Schema | None = None
        counts: list[int | None] = []
        for source in self.sources:
            reader = self._open(source)
            self.readers.append(reader)
            if self.schema is None:
                self.schema = reader.schema
                self._check_column(source)
            elif not reader.schema.remove_metadata().equals(self.schema.remove_metadata()):
                raise input_error(
                    f"{source.spec} has other columns or types than {self.sources[0].spec}; inputs must match",
                    source.spec,
                    self.sources[0].spec,
                )
            counts.append(self._count(reader, source))
        self.num_rows: int | None = None if None in counts else sum(c for c in counts if c is not None)

    def _open(self, source: Source) -> _ParquetFiles | _Scanned:
        if source.format == "parquet" and not source.remote:
            for path in source.files:
                if os.path.getsize(path) == 0:
                    raise input_error(f"{path} is empty (0 bytes), not a Parquet file", source.spec)
        if source.format == "parquet" and not source.remote and not _partitioned(source):
            return _ParquetFiles(source)
        return _Scanned(source, self.column)

    def _check_column(self, source: Source) -> None:
        assert self.schema is not None
        if self.column not in self.schema.names:
            raise input_error(
                f"no column {self.column!r} in {source.spec}; its columns are: {', '.join(self.schema.names)}",
                source.spec,
            )
        if not _is_text(self.schema.field(self.column).type):
            raise input_error(
                f"column {self.column!r} in {source.spec} holds {self.schema.field(self.column).type}, not text",
                source.spec,
            )

    def _count(self, reader: _ParquetFiles | _Scanned, source: Source) -> int | None:
        if source.remote and source.format != "parquet":
            return None
        try:
            return reader.count_rows()
        except (pa.ArrowException, OSError) as exc:
            raise _unreadable(source.spec, source.format, exc) from None

    def batch_rows(self) -> int:
        """Rows per batch: ``BATCH_ROWS``, or fewer so that a batch of wide rows stays near ``BATCH_BYTES``."""
        widths = [width for reader in self.readers if (width := reader.row_bytes())]
        if not widths:
            return BATCH_ROWS
        return max(1, min(BATCH_ROWS, int(BATCH_BYTES // max(widths))))

    def batches(self, batch_rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """The rows in record batches, in order. An input that breaks after rows were read raises
        ``BrokenInputError``; one that breaks before, ``InputError``."""
        rows = batch_rows or self.batch_rows()
        read_any = False
        for source, reader in zip(self.sources, self.readers):
            try:
                for batch in reader.batches(rows):
                    read_any = True
                    yield batch
            except (pa.ArrowException, OSError) as exc:
                problem = _unreadable(reader.where, source.format, exc, source.spec)
                if read_any:  # rows were read (and may be answered): a stop, not a usage error
                    raise BrokenInputError(str(problem)) from None
                raise problem from None

    def texts(self, batch_rows: int | None = None) -> Iterator[Any]:
        for batch in self.batches(batch_rows):
            yield from batch.column(self.column).to_pylist()

    def close(self) -> None:
        for reader in self.readers:
            reader.close()
