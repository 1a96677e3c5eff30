"""Where datasets are: local paths and remote URIs located on their filesystems, and an input's
spec resolved to its files in order and their format; errors about a location say no credential."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.fs as pafs

from ..service.errors import InputError, location_secrets, one_line, redact, redact_location

__all__ = [
    "INPUT_FORMATS",
    "OUTPUT_FORMATS",
    "Source",
    "resolve",
    "locate",
    "is_uri",
    "format_by_extension",
    "input_error",
]

INPUT_FORMATS = {"parquet": (".parquet", ".pq", ".parq"), "csv": (".csv",), "jsonl": (".jsonl", ".ndjson", ".json")}
OUTPUT_FORMATS = {"parquet": (".parquet", ".pq"), "csv": (".csv",), "jsonl": (".jsonl", ".ndjson")}
_HTTP = ("http", "https")


def is_uri(spec: str) -> bool:
    scheme, sep, _ = spec.partition("://")
    return bool(sep) and scheme.isalnum() and len(scheme) > 1  # not a Windows drive letter


def locate(spec: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the path on it: local paths and ``file://``, pyarrow's own remote
    filesystems (s3, gs, abfs, hdfs), and fsspec's for the rest (http, https, ...)."""
    if not is_uri(spec):
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
                raise input_error(f"{spec}: {one_line(exc)}", spec) from None
        except OSError as exc:
            raise input_error(f"{spec}: {one_line(exc)}", spec) from None
    try:
        import fsspec
        from pyarrow.fs import FSSpecHandler, PyFileSystem
    except ImportError:
        raise InputError(f"{scheme}:// paths need fsspec: pip install 'batchsum[cloud]'") from None
    try:
        filesystem, path = fsspec.core.url_to_fs(spec)
    except (ImportError, ValueError) as exc:
        raise input_error(
            f"{scheme}:// paths need a library fsspec could not load ({one_line(exc)}): pip install 'batchsum[cloud]'",
            spec,
        ) from None
    return PyFileSystem(FSSpecHandler(filesystem)), path


def input_error(message: str, *specs: str) -> InputError:
    """An ``InputError`` whose message holds no credential of ``specs`` (the locations it is about):
    the locations in it redacted, and what a library said in its own words (a decoded password, an
    access key) taken out too."""
    secrets = tuple(secret for spec in specs for secret in location_secrets(spec))
    return InputError(redact(redact_location(message), secrets))


def format_by_extension(name: str, formats: dict[str, tuple[str, ...]]) -> str | None:
    if is_uri(name):  # the path's extension, not the query's (a presigned URL ends in its signature)
        name = name.split("?", 1)[0].split("#", 1)[0]
    lowered = name.lower()
    return next((fmt for fmt, endings in formats.items() if lowered.endswith(endings)), None)


def _hidden(path: str, base: str) -> bool:
    """A file or folder under ``base`` whose name starts with "." or "_" (``.git``, ``_SUCCESS``,
    Spark's ``_temporary``): not data."""
    relative = PurePosixPath(path.replace(os.sep, "/")).relative_to(PurePosixPath(base.replace(os.sep, "/")))
    return any(part.startswith((".", "_")) for part in relative.parts)


@dataclass
class Source:
    """One input spec, resolved: its filesystem, files in order, format, and hive base folder."""

    spec: str
    filesystem: pafs.FileSystem
    files: list[str]
    format: str
    base: str | None  # a folder whose key=value sub-folders are columns
    remote: bool


def resolve(spec: str, format: str | None) -> Source:
    filesystem, path = locate(spec)
    remote = is_uri(spec) and not spec.lower().startswith("file://")
    try:
        info = filesystem.get_file_info(path)
    except OSError as exc:
        raise input_error(f"{spec}: {one_line(exc)}", spec) from None
    base = None
    if info.type == pafs.FileType.File:
        files = [path]
    elif info.type == pafs.FileType.Directory:
        try:
            found = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
        except OSError as exc:
            raise input_error(f"{spec}: {one_line(exc)}", spec) from None
        files = sorted(f.path for f in found if f.type == pafs.FileType.File and not _hidden(f.path, path))
        if format is None:
            files = [f for f in files if format_by_extension(f, INPUT_FORMATS)]
        base = path
        if not files:
            known = ", ".join(e for endings in INPUT_FORMATS.values() for e in endings)
            raise input_error(f"folder {spec} holds no data files ({known})", spec)
    elif any(c in spec for c in "*?[") and not remote:
        files = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
        if not files:
            raise input_error(f"no file matches {spec!r}", spec)
    else:
        raise input_error(f"{spec}: no such file or folder", spec)
    if format is None:
        formats = {format_by_extension(f, INPUT_FORMATS) for f in files}
        if len(formats) != 1 or None in formats:
            raise input_error(
                f"cannot tell the format of {spec} from its extension; pass --format parquet, csv or jsonl", spec
            )
        format = formats.pop()
    assert format is not None
    return Source(spec, filesystem, files, format, base, remote)
