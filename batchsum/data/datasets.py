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
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.fs as pafs
import pyarrow.json as pjson
import pyarrow.parquet as pq

if TYPE_CHECKING:
    import pyarrow.dataset as ds

from ..service.errors import BrokenInputError, InputError, location_secrets, one_line, redact, redact_location
from .csvsafe import neutralize
from .results import RESULT_DTYPES, RowResult, arrow_types, result_columns

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

BATCH_ROWS = 1024  # rows read at once, at most ...
BATCH_BYTES = 2 << 20  # ... and fewer when the rows are wide: about this many bytes (Parquet's own sizes)
ROW_GROUP_BYTES = 16 << 20  # a Parquet output's row groups: about this many bytes each (held until written)

# summary, status, error, message, http_status, attempts; pandas reads Parquet outputs back with
# the accessor's dtypes (engine.RESULT_DTYPES), through the pandas metadata written with them.
RESULT_TYPES = arrow_types()

INPUT_FORMATS = {"parquet": (".parquet", ".pq", ".parq"), "csv": (".csv",), "jsonl": (".jsonl", ".ndjson", ".json")}
OUTPUT_FORMATS = {"parquet": (".parquet", ".pq"), "csv": (".csv",), "jsonl": (".jsonl", ".ndjson")}
_HTTP = ("http", "https")


def _is_uri(spec: str) -> bool:
    scheme, sep, _ = spec.partition("://")
    return bool(sep) and scheme.isalnum() and len(scheme) > 1  # not a Windows drive letter


def _filesystem(spec: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the path on it: local paths and ``file://``, pyarrow's own remote
    filesystems (s3, gs, abfs, hdfs), and fsspec's for the rest (http, https, ...)."""
    if not _is_uri(spec):
        return pafs.LocalFileSystem(), os.path.abspath(spec)
    scheme = spec.partition("://")[0].lower()
    if scheme not in _HTTP:
        try:
            filesystem, path = pafs.FileSystem.from_uri(spec)
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            if scheme == "s3" and endpoint:  # an S3-compatible store (MinIO, R2, moto): the standard variable
                filesystem = pafs.S3FileSystem(endpoint_override=endpoint)
            return filesystem, path
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            if "Unrecognized filesystem type" not in str(exc):
                raise _fail(f"{spec}: {one_line(exc)}", spec) from None
        except OSError as exc:
            raise _fail(f"{spec}: {one_line(exc)}", spec) from None
    try:
        import fsspec
        from pyarrow.fs import FSSpecHandler, PyFileSystem
    except ImportError:
        raise InputError(f"{scheme}:// paths need fsspec: pip install 'batchsum[cloud]'") from None
    try:
        filesystem, path = fsspec.core.url_to_fs(spec)
    except (ImportError, ValueError) as exc:
        raise _fail(
            f"{scheme}:// paths need a library fsspec could not load ({one_line(exc)}): pip install 'batchsum[cloud]'",
            spec,
        ) from None
    return PyFileSystem(FSSpecHandler(filesystem)), path


def _fail(message: str, *specs: str) -> InputError:
    """An ``InputError`` whose message holds no credential of ``specs`` (the locations it is about):
    the locations in it redacted, and what a library said in its own words (a decoded password, an
    access key) taken out too."""
    secrets = tuple(secret for spec in specs for secret in location_secrets(spec))
    return InputError(redact(redact_location(message), secrets))


_NAMES = {"parquet": "Parquet", "csv": "CSV", "jsonl": "JSON Lines"}


def _unreadable(what: str, format: str, exc: BaseException, *specs: str) -> InputError:
    """ "X cannot be read as Parquet: <pyarrow's reason, without its preamble>"."""
    reason = one_line(exc)
    if "magic bytes not found" in reason:
        reason = "not a Parquet file (no Parquet footer)"
    else:
        reason = reason.rsplit("?: ", 1)[-1].rsplit("': ", 1)[-1]
    return _fail(f"{what} cannot be read as {_NAMES.get(format, format)}: {reason}", what, *specs)


def _format_by_extension(name: str, formats: dict[str, tuple[str, ...]]) -> str | None:
    if _is_uri(name):  # the path's extension, not the query's (a presigned URL ends in its signature)
        name = name.split("?", 1)[0].split("#", 1)[0]
    lowered = name.lower()
    return next((fmt for fmt, endings in formats.items() if lowered.endswith(endings)), None)


def _hidden(path: str, base: str) -> bool:
    """A file or folder under ``base`` whose name starts with "." or "_" (``.git``, ``_SUCCESS``,
    Spark's ``_temporary``): not data."""
    relative = PurePosixPath(path.replace(os.sep, "/")).relative_to(PurePosixPath(base.replace(os.sep, "/")))
    return any(part.startswith((".", "_")) for part in relative.parts)


@dataclass
class _Source:
    """One input spec, resolved: its filesystem, files in order, format, and hive base folder."""

    spec: str
    filesystem: pafs.FileSystem
    files: list[str]
    format: str
    base: str | None  # a folder whose key=value sub-folders are columns
    remote: bool


def _resolve(spec: str, format: str | None) -> _Source:
    filesystem, path = _filesystem(spec)
    remote = _is_uri(spec) and not spec.lower().startswith("file://")
    try:
        info = filesystem.get_file_info(path)
    except OSError as exc:
        raise _fail(f"{spec}: {one_line(exc)}", spec) from None
    base = None
    if info.type == pafs.FileType.File:
        files = [path]
    elif info.type == pafs.FileType.Directory:
        try:
            found = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
        except OSError as exc:
            raise _fail(f"{spec}: {one_line(exc)}", spec) from None
        files = sorted(f.path for f in found if f.type == pafs.FileType.File and not _hidden(f.path, path))
        if format is None:
            files = [f for f in files if _format_by_extension(f, INPUT_FORMATS)]
        base = path
        if not files:
            known = ", ".join(e for endings in INPUT_FORMATS.values() for e in endings)
            raise _fail(f"folder {spec} holds no data files ({known})", spec)
    elif any(c in spec for c in "*?[") and not remote:
        files = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
        if not files:
            raise _fail(f"no file matches {spec!r}", spec)
    else:
        raise _fail(f"{spec}: no such file or folder", spec)
    if format is None:
        formats = {_format_by_extension(f, INPUT_FORMATS) for f in files}
        if len(formats) != 1 or None in formats:
            raise _fail(
                f"cannot tell the format of {spec} from its extension; pass --format parquet, csv or jsonl", spec
            )
        format = formats.pop()
    assert format is not None
    return _Source(spec, filesystem, files, format, base, remote)


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


def _partitioned(source: _Source) -> bool:
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

    def __init__(self, source: _Source) -> None:
        self.paths = source.files
        self.where = source.spec  # the file being read
        self.files: list[pq.ParquetFile] = []
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
                raise _fail(f"{path} has other columns or types than {source.files[0]}; inputs must match", source.spec)

    def count_rows(self) -> int:
        return sum(file.metadata.num_rows for file in self.files)

    def row_bytes(self) -> float:
        """The rows' mean width, uncompressed, from the files' own statistics."""
        size = sum(
            file.metadata.row_group(i).total_byte_size for file in self.files for i in range(file.num_row_groups)
        )
        return float(size) / max(1, self.count_rows())

    def batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        for path, file in zip(self.paths, self.files):
            self.where = path
            yield from file.iter_batches(batch_size=batch_rows, use_threads=False)

    def close(self) -> None:
        for file in self.files:
            file.close()


class _Scanned:
    """An input read through ``pyarrow.dataset``: CSV, JSON Lines, hive partitions, remote files."""

    def __init__(self, source: _Source, column: str) -> None:
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
        self.sources = [_resolve(os.fspath(spec), format) for spec in specs]
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
                raise _fail(
                    f"{source.spec} has other columns or types than {self.sources[0].spec}; inputs must match",
                    source.spec,
                    self.sources[0].spec,
                )
            counts.append(self._count(reader, source))
        self.num_rows: int | None = None if None in counts else sum(c for c in counts if c is not None)
        if self.num_rows == 0:
            raise _fail(f"{', '.join(self.uris)}: no rows to summarize", *self.uris)

    def _open(self, source: _Source) -> _ParquetFiles | _Scanned:
        if source.format == "parquet" and not source.remote:
            for path in source.files:
                if os.path.getsize(path) == 0:
                    raise _fail(f"{path} is empty (0 bytes), not a Parquet file", source.spec)
        if source.format == "parquet" and not source.remote and not _partitioned(source):
            return _ParquetFiles(source)
        return _Scanned(source, self.column)

    def _check_column(self, source: _Source) -> None:
        assert self.schema is not None
        if self.column not in self.schema.names:
            raise _fail(
                f"no column {self.column!r} in {source.spec}; its columns are: {', '.join(self.schema.names)}",
                source.spec,
            )
        if not _is_text(self.schema.field(self.column).type):
            raise _fail(
                f"column {self.column!r} in {source.spec} holds {self.schema.field(self.column).type}, not text",
                source.spec,
            )

    def _count(self, reader: _ParquetFiles | _Scanned, source: _Source) -> int | None:
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


def _output_format(target: str) -> str:
    found = _format_by_extension(target, OUTPUT_FORMATS)
    if found is None:
        known = ", ".join(e for endings in OUTPUT_FORMATS.values() for e in endings)
        raise _fail(f"cannot tell the output format of {target}: name it with one of {known}", target)
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
    filesystem, path = _filesystem(spec)
    remote = _is_uri(spec) and not spec.lower().startswith("file://")
    if not remote:
        local = Path(path)
        if local.is_dir():
            raise _fail(f"output {spec} is a folder; give a file name", spec)
        if not local.parent.is_dir():
            raise _fail(f"cannot write {spec}: folder {local.parent} does not exist", spec)
        if inputs is not None and any(local.resolve() == p.resolve() for p in inputs.paths):
            raise _fail(f"output {spec} is also an input; write to another file", spec)
    else:
        # Object stores have no folders: only the bucket (the path's first part) must exist.
        bucket = path.split("/", 1)[0]
        try:
            info = filesystem.get_file_info(bucket)
        except OSError as exc:
            raise _fail(f"cannot write {spec}: {one_line(exc)}", spec) from None
        if info.type == pafs.FileType.NotFound:
            raise _fail(f"cannot write {spec}: bucket {bucket} does not exist", spec)
        if inputs is not None and spec in inputs.uris:
            raise _fail(f"output {spec} is also an input; write to another file", spec)
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
            raise _fail(
                f"cannot write {self.target.spec}: {exc.strerror} in folder {folder}", self.target.spec
            ) from None
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it private; the output is an ordinary file
        self.partial = Path(partial)
        self._file = os.fdopen(fd, "wb")
        self._writer: Any
        self._group: list[pa.RecordBatch] = []  # a Parquet output's next row group, until it is large enough
        self._group_bytes = 0
        if self.target.format == "parquet":
            self._writer = pq.ParquetWriter(self._file, self.schema)
        elif self.target.format == "csv":
            self._writer = pcsv.CSVWriter(self._file, self.schema)
        else:
            self._writer = _JsonLinesWriter(self._file)

    @property
    def path(self) -> str:
        return self.target.spec

    def write(self, batch: pa.RecordBatch, results: Sequence[RowResult]) -> None:
        columns: list[tuple[Any, ...]] = list(zip(*results)) if results else [() for _ in RESULT_TYPES]
        arrays = batch.columns + [pa.array(values, type=t) for values, t in zip(columns, RESULT_TYPES)]
        for index in self._neutralized:
            arrays[index] = neutralize(arrays[index])
        out = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        if self.target.format != "parquet":
            self._writer.write_batch(out)
            return
        # Row groups of about ROW_GROUP_BYTES: readers want them large, memory wants them bounded.
        self._group.append(out)
        self._group_bytes += out.nbytes
        if self._group_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._group:
            self._writer.write_table(pa.Table.from_batches(self._group, schema=self.schema))
            self._group.clear()
            self._group_bytes = 0

    def commit(self) -> None:
        if self.target.format == "parquet":
            self._flush()
        self._writer.close()
        self._file.close()
        if not self.target.remote:
            try:
                os.replace(self.partial, self.target.local)
            except OSError as exc:  # the folder turned read-only, a quota, a vanished mount
                raise _fail(
                    f"cannot write {self.target.spec} ({exc.strerror or one_line(exc)}); every answer is in "
                    "the journal: run the same command again once it can be written, and nothing is paid twice",
                    self.target.spec,
                ) from None
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
            raise _fail(
                f"cannot put {self.target.spec} ({one_line(exc)}); the output is kept in {kept}", self.target.spec
            ) from None
        self.partial.unlink(missing_ok=True)

    def abort(self) -> None:
        self._group.clear()
        if not self._file.closed:
            self._writer.close()
            self._file.close()
        with contextlib.suppress(OSError):  # a folder made read-only keeps it: nothing more to do
            self.partial.unlink(missing_ok=True)
