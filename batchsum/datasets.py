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

import glob
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.json as pjson
import pyarrow.parquet as pq

from .csvsafe import neutralize
from .errors import BrokenInputError, InputError, location_secrets, one_line, redact, redact_location
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

BATCH_ROWS = 1024

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


def _file_format(format: str, column: str) -> ds.FileFormat:
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


def _scan_options(format: str) -> dict[str, Any]:
    if format == "parquet":
        return {"fragment_scan_options": ds.ParquetFragmentScanOptions(pre_buffer=False)}
    return {}


def _is_text(arrow_type: pa.DataType) -> bool:
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return bool(pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_null(arrow_type))


class DatasetInput:
    """One or more inputs of one schema (files, folders, globs, remote URIs), read as a stream of
    record batches in order. ``num_rows`` is None when counting would mean reading a remote CSV or
    JSON file twice."""

    def __init__(self, specs: Sequence[str | os.PathLike[str]], column: str, *, format: str | None = None) -> None:
        if not specs:
            raise InputError("no input given")
        if format is not None and format not in INPUT_FORMATS:
            raise InputError(f"unknown --format {format!r}: use parquet, csv or jsonl")
        self.column = column
        self.sources = [_resolve(os.fspath(spec), format) for spec in specs]
        self.paths = [Path(f) for s in self.sources if not s.remote for f in s.files]  # local files, to guard
        self.uris = [s.spec for s in self.sources]
        self.datasets: list[ds.Dataset] = []
        self.schema: pa.Schema | None = None
        counts: list[int | None] = []
        for source in self.sources:
            dataset = self._open(source)
            if self.schema is None:
                self.schema = dataset.schema
                self._check_column(source)
            elif not dataset.schema.remove_metadata().equals(self.schema.remove_metadata()):
                raise _fail(
                    f"{source.spec} has other columns or types than {self.sources[0].spec}; inputs must match",
                    source.spec,
                    self.sources[0].spec,
                )
            self.datasets.append(dataset)
            counts.append(self._count(dataset, source))
        self.num_rows: int | None = None if None in counts else sum(c for c in counts if c is not None)
        if self.num_rows == 0:
            raise _fail(f"{', '.join(self.uris)}: no rows to summarize", *self.uris)

    def _open(self, source: _Source) -> ds.Dataset:
        try:
            if source.format == "parquet":
                for path in source.files:
                    if not source.remote and os.path.getsize(path) == 0:
                        raise _fail(f"{path} is empty (0 bytes), not a Parquet file", source.spec)
            return ds.dataset(
                source.files,
                filesystem=source.filesystem,
                format=_file_format(source.format, self.column),
                partitioning="hive" if source.base is not None else None,
                partition_base_dir=source.base,
            )
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise _unreadable(source.spec, source.format, exc) from None

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

    def _count(self, dataset: ds.Dataset, source: _Source) -> int | None:
        if source.remote and source.format != "parquet":
            return None
        try:
            return int(dataset.count_rows())
        except (pa.ArrowException, OSError) as exc:
            raise _unreadable(source.spec, source.format, exc) from None

    def batches(self, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """The rows in record batches, in order. An input that breaks after rows were read raises
        ``BrokenInputError``; one that breaks before, ``InputError``."""
        read_any = False
        for source, dataset in zip(self.sources, self.datasets):
            fragments = sorted(dataset.get_fragments(), key=lambda fragment: fragment.path)
            for fragment in fragments:
                # One batch and one file read ahead, and no whole-row-group prefetch: memory stays
                # bounded by the batch, not by the file's layout.
                scanner = ds.Scanner.from_fragment(
                    fragment,
                    schema=dataset.schema,
                    batch_size=batch_rows,
                    batch_readahead=1,
                    fragment_readahead=1,
                    **_scan_options(source.format),
                )
                try:
                    for batch in scanner.to_batches():
                        read_any = True
                        yield batch
                except (pa.ArrowException, OSError) as exc:
                    problem = _unreadable(fragment.path, source.format, exc, source.spec)
                    if read_any:  # rows were read (and may be answered): a stop, not a usage error
                        raise BrokenInputError(str(problem)) from None
                    raise problem from None

    def texts(self, batch_rows: int = BATCH_ROWS) -> Iterator[Any]:
        for batch in self.batches(batch_rows):
            yield from batch.column(self.column).to_pylist()


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
    """``schema`` with pandas metadata that reads the result columns back as ``RESULT_DTYPES``."""

    try:
        frame = schema.remove_metadata().empty_table().to_pandas()
        for name, dtype in zip(names, RESULT_DTYPES):
            frame[name] = frame[name].astype(dtype)
        pandas = pa.Schema.from_pandas(frame, preserve_index=False).metadata[b"pandas"]
    except (pa.ArrowException, TypeError, ValueError, KeyError):
        return schema  # an input type pandas cannot hold: plain Arrow types are still right
    return schema.with_metadata({**(schema.metadata or {}), b"pandas": pandas})


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
        self._writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self.schema))

    def commit(self) -> None:
        self._writer.close()
        self._file.close()
        if not self.target.remote:
            os.replace(self.partial, self.target.local)
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
        if not self._file.closed:
            self._writer.close()
            self._file.close()
        self.partial.unlink(missing_ok=True)
