"""Arrow datasets in and out, streamed.

Inputs go through ``pyarrow.dataset``: Parquet, CSV and JSON Lines, chosen by extension or
``format``; a file, a folder (recursive; hive partitions such as ``year=2024/`` become columns), a
glob, or several of them with one schema; local paths or remote URIs (``s3://``, ``gs://``,
``abfs://`` through pyarrow's filesystems; ``http(s)://`` through fsspec, extra ``cloud``), with
credentials and endpoints from where those libraries read them (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``~/.aws``, ...). Rows are read in record batches, in the dataset's order:
the inputs as given, a folder's files by path (sorted as text), each file's rows in order.

The output's format follows its extension (``.parquet``, ``.csv``, ``.jsonl``); anything else is
refused before anything is sent. Every input column plus the result columns; a local output is
written to a unique temporary name beside it and renamed when complete; a remote output is written
locally and put as one object at the end (an object store PUT is atomic).

Here: the output. The inputs are read in ``dataset_input``, located (local or remote, and the
filesystem each is on) in ``locations``; their names are importable from here as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..service.errors import InputError, OutputError, one_line
from .csvsafe import neutralize
from .dataset_input import BATCH_BYTES as BATCH_BYTES
from .dataset_input import BATCH_ROWS as BATCH_ROWS
from .dataset_input import DatasetInput as DatasetInput
from .locations import INPUT_FORMATS as INPUT_FORMATS
from .locations import OUTPUT_FORMATS, format_by_extension, input_error, is_uri, locate
from .results import RESULT_DTYPES, RowResult, arrow_columns, arrow_types, result_columns

__all__ = [
    "DatasetInput",
    "DatasetOutput",
    "check_output",
    "default_journal",
    "INPUT_FORMATS",
    "OUTPUT_FORMATS",
    "RESULT_TYPES",
    "BATCH_ROWS",
]

ROW_GROUP_BYTES = 16 << 20  # a Parquet output's row groups: about this many bytes each (held until written)
WRITE_BUFFER = 4 << 20  # what a Parquet output's writer gathers before it goes to the file

# summary, status, error, message, http_status, attempts; pandas reads Parquet outputs back with
# the accessor's dtypes (engine.RESULT_DTYPES), through the pandas metadata written with them.
RESULT_TYPES = arrow_types()


def _output_format(target: str) -> str:
    found = format_by_extension(target, OUTPUT_FORMATS)
    if found is None:
        known = ", ".join(e for endings in OUTPUT_FORMATS.values() for e in endings)
        raise input_error(f"cannot tell the output format of {target}: name it with one of {known}", target)
    return found


@dataclass(frozen=True)
class _Target:
    spec: str
    filesystem: pafs.FileSystem
    path: str
    format: str
    remote: bool

    @property
    def local(self) -> Path:
        return Path(self.path)


def check_output(target: str | os.PathLike[str], inputs: DatasetInput | None = None) -> _Target:
    """Where the output goes, when a file can be written there; else an ``InputError`` saying why."""
    spec = os.fspath(target)
    format = _output_format(spec)
    filesystem, path = locate(spec)
    remote = is_uri(spec) and not spec.lower().startswith("file://")
    if not remote:
        local = Path(path)
        if local.is_dir():
            raise input_error(f"output {spec} is a folder; give a file name", spec)
        if not local.parent.is_dir():
            raise input_error(f"cannot write {spec}: folder {local.parent} does not exist", spec)
        if inputs is not None and any(local.resolve() == p.resolve() for p in inputs.paths):
            raise input_error(f"output {spec} is also an input; write to another file", spec)
    else:
        # Object stores have no folders: only the bucket (the path's first part) must exist.
        bucket = path.split("/", 1)[0]
        try:
            info = filesystem.get_file_info(bucket)
        except OSError as exc:
            raise input_error(f"cannot write {spec}: {one_line(exc)}", spec) from None
        if info.type == pafs.FileType.NotFound:
            raise input_error(f"cannot write {spec}: bucket {bucket} does not exist", spec)
        if inputs is not None and spec in inputs.uris:
            raise input_error(f"output {spec} is also an input; write to another file", spec)
    return _Target(spec, filesystem, path, format, remote)


def default_journal(target: _Target) -> Path:
    """``OUTPUT.journal.sqlite`` beside a local output (beside the file it resolves to, when it is
    reached through a symlink or ``..``: every spelling of one output shares one journal); for a
    remote one, a file named after it in the user's cache folder (the journal must be local: it is
    written at every answer)."""
    if not target.remote:
        local = target.local
        if os.path.realpath(local) != os.path.abspath(local):
            local = Path(os.path.realpath(local))
        return local.with_name(local.name + ".journal.sqlite")
    import platformdirs

    digest = hashlib.sha256(target.spec.encode()).hexdigest()[:12]
    folder = Path(platformdirs.user_cache_dir("batchsum", appauthor=False)) / "journals"
    return folder / f"{PurePosixPath(target.path).name}.{digest}.journal.sqlite"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _pandas_metadata(schema: pa.Schema, names: Sequence[str]) -> pa.Schema:
    """``schema`` with the pandas metadata that reads the result columns back as ``RESULT_DTYPES``
    (pandas' string dtype, nullable Int32), written by hand: no pandas needed to write it. The input
    columns are listed with the types Arrow gives them; pandas converts those as it would anyway."""
    from pyarrow.pandas_compat import get_logical_type

    results = dict(zip(names, RESULT_DTYPES))
    columns = []
    for field in schema:
        dtype = results.get(field.name)
        if dtype is not None:
            pandas_type = "object" if dtype == "string" else dtype.lower()
            numpy_type = dtype
        else:
            try:
                pandas_type = get_logical_type(field.type)
                numpy_type = str(field.type.to_pandas_dtype().__name__)
            except (NotImplementedError, TypeError, ValueError, AttributeError):
                pandas_type, numpy_type = "object", "object"
            if pa.types.is_dictionary(field.type):
                pandas_type = "object"  # categories are read back from the Arrow type itself
        columns.append(
            {
                "name": field.name,
                "field_name": field.name,
                "pandas_type": pandas_type,
                "numpy_type": numpy_type,
                "metadata": None,
            }
        )
    metadata = {
        "index_columns": [],
        "column_indexes": [],
        "columns": columns,
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.0.0",
    }
    existing = {k: v for k, v in (schema.metadata or {}).items() if k != b"pandas"}
    return schema.with_metadata({**existing, b"pandas": json.dumps(metadata).encode()})


class _JsonLinesWriter:
    """One JSON object per line, UTF-8 (values JSON cannot hold, such as dates, as text)."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file

    def write_batch(self, batch: pa.RecordBatch) -> None:
        lines = (json.dumps(row, ensure_ascii=False, default=str) for row in batch.to_pylist())
        self._file.write("".join(line + "\n" for line in lines).encode("utf-8"))

    def close(self) -> None:
        self._file.flush()


class _RowGroups:
    """A Parquet output's row groups: batches gathered until about ``ROW_GROUP_BYTES`` (readers want
    them large, memory wants them bounded), then encoded and written on a thread of their own (pyarrow
    lets the GIL go meanwhile) while the next is made. One group at a time: the next waits for the one
    before, whose error (a full disk) is raised then. Written through a native buffer, so the thread
    needs the GIL for the file only when a buffer's worth goes to it, not at every page."""

    def __init__(self, file: IO[bytes], schema: pa.Schema) -> None:
        self._schema = schema
        self._sink = pa.BufferedOutputStream(pa.PythonFile(file, mode="w"), WRITE_BUFFER)
        self._writer = pq.ParquetWriter(self._sink, schema)
        self._group: list[pa.RecordBatch] = []
        self._bytes = 0
        self._thread: ThreadPoolExecutor | None = None
        self._writing: Future[None] | None = None

    def write_batch(self, batch: pa.RecordBatch) -> None:
        self._group.append(batch)
        self._bytes += batch.nbytes
        if self._bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._group:
            return
        table = pa.Table.from_batches(self._group, schema=self._schema)
        self._group, self._bytes = [], 0
        self._written()
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="batchsum-write")
        self._writing = self._thread.submit(self._writer.write_table, table)

    def _written(self, *, quietly: bool = False) -> None:
        """Wait for the group on the writer's thread; its error raised unless ``quietly``."""
        writing, self._writing = self._writing, None
        if writing is None:
            return
        try:
            writing.result()
        except Exception:
            if not quietly:
                raise

    def _end(self) -> None:
        if self._thread is not None:
            self._thread.shutdown()
            self._thread = None
        self._writer.close()
        self._sink.close()  # what is still in the buffer goes to the file

    def close(self) -> None:
        """Every group written, the file's footer after them."""
        try:
            self._flush()
            self._written()
        except BaseException:
            self.abort()
            raise
        self._end()

    def abort(self) -> None:
        """The group not yet handed over dropped; the one being written waited for, its error ignored;
        what the buffer still holds dropped too when it cannot be written (a full disk fails it again)."""
        self._group.clear()
        self._written(quietly=True)
        with contextlib.suppress(OSError, pa.ArrowException):
            self._end()


class DatasetOutput:
    """The output, written batch by batch to a temporary file of its own (created exclusively, a
    unique name per run: beside a local output, in the temporary folder for a remote one) and moved
    into place when complete: renamed, or put as one object.

    In a CSV output, a summary or service message that begins like a spreadsheet formula (``=``,
    ``+``, ``-``, ``@``, a tab, a carriage return) is written with a leading ``'``, so that no
    spreadsheet runs it (``csvsafe``); ``raw_csv=True`` writes such cells as they came. Parquet and
    JSON Lines outputs hold the text as it came, always."""

    def __init__(
        self,
        target: str | os.PathLike[str] | _Target,
        input_schema: pa.Schema,
        output_column: str = "summary",
        inputs: DatasetInput | None = None,
        *,
        raw_csv: bool = False,
    ) -> None:
        self.target = target if isinstance(target, _Target) else check_output(target, inputs)
        names = result_columns(output_column)
        # The columns holding the service's text (the summary, its message), by position in the batch.
        service_text = (names[0], names[3])
        clash = [n for n in names if n in input_schema.names]
        if clash:
            raise InputError(f"the input already has column {clash[0]!r}; choose another name with --output-column")
        schema = input_schema
        for name, arrow_type in zip(names, RESULT_TYPES):
            schema = schema.append(pa.field(name, arrow_type))
        if self.target.format == "csv":
            nested = [f.name for f in schema if pa.types.is_nested(f.type)]
            if nested:
                raise InputError(
                    f"column {nested[0]!r} holds {schema.field(nested[0]).type}, which CSV cannot "
                    "hold; write .parquet or .jsonl"
                )
        self.schema = _pandas_metadata(schema, names) if self.target.format == "parquet" else schema
        neutralize_formulas = self.target.format == "csv" and not raw_csv
        self._neutralized = [self.schema.get_field_index(n) for n in service_text] if neutralize_formulas else []
        folder = tempfile.gettempdir() if self.target.remote else str(self.target.local.parent)
        name = PurePosixPath(self.target.path).name
        try:
            fd, partial = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=folder)
        except OSError as exc:
            raise input_error(
                f"cannot write {self.target.spec}: {exc.strerror} in folder {folder}", self.target.spec
            ) from None
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it private; the output is an ordinary file
        self.partial = Path(partial)
        self._file = os.fdopen(fd, "wb")
        self._writer: Any
        if self.target.format == "parquet":
            self._writer = _RowGroups(self._file, self.schema)
        elif self.target.format == "csv":
            self._writer = pcsv.CSVWriter(self._file, self.schema)
        else:
            self._writer = _JsonLinesWriter(self._file)

    @property
    def path(self) -> str:
        return self.target.spec

    def write(self, batch: pa.RecordBatch, results: Sequence[RowResult]) -> None:
        try:
            self._write(batch, results)
        except OSError as exc:  # a full disk, a quota, a folder turned read-only
            raise self._cannot_write(exc) from None

    def _cannot_write(self, exc: OSError) -> Exception:
        """A full disk, a quota, a folder turned read-only: the one line, and what to do."""
        return _output_error(
            f"cannot write {self.target.spec} ({exc.strerror or one_line(exc)}); every answer is in the "
            "journal: run the same command again once it can be written, and nothing is paid twice",
            self.target.spec,
        )

    def _write(self, batch: pa.RecordBatch, results: Sequence[RowResult]) -> None:
        arrays = batch.columns + arrow_columns(results)
        for index in self._neutralized:
            arrays[index] = neutralize(arrays[index])
        self._writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self.schema))

    def commit(self) -> None:
        try:
            self._writer.close()
            self._file.close()
        except OSError as exc:  # a full disk, a quota: the last row group, the footer
            raise self._cannot_write(exc) from None
        if not self.target.remote:
            try:
                os.replace(self.partial, self.target.local)
            except OSError as exc:  # the folder turned read-only, a quota, a vanished mount
                raise self._cannot_write(exc) from None
            return
        try:
            with (
                open(self.partial, "rb") as local,
                self.target.filesystem.open_output_stream(self.target.path) as remote,
            ):
                shutil.copyfileobj(local, remote, 8 << 20)
        except (OSError, pa.ArrowException) as exc:
            kept = self.partial.with_name(self.partial.name.removeprefix(".").removesuffix(".partial"))
            os.replace(self.partial, kept)
            raise _output_error(
                f"cannot put {self.target.spec} ({one_line(exc)}); the output is kept in {kept}", self.target.spec
            ) from None
        self.partial.unlink(missing_ok=True)

    def abort(self) -> None:
        """The partial output removed, whatever its writing left: an abort after a full disk raises
        nothing of its own (the error that stopped the run is the one said)."""
        if not self._file.closed:
            with contextlib.suppress(OSError, pa.ArrowException):
                if isinstance(self._writer, _RowGroups):
                    self._writer.abort()
                else:
                    self._writer.close()
            with contextlib.suppress(OSError):  # its last flush fails again; the file is closed all the same
                self._file.close()
        with contextlib.suppress(OSError):  # a folder made read-only keeps it: nothing more to do
            self.partial.unlink(missing_ok=True)


def _output_error(message: str, spec: str) -> OutputError:
    """An ``OutputError`` whose message holds no credential of the output's location."""
    return OutputError(str(input_error(message, spec)))
