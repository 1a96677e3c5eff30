"""Content decoding in bounded steps: an answer's raw bytes inflated a piece at a time, so that the
size cap sees decoded bytes before they pile up.

httpx decodes a whole received chunk in one decoder call: a 64 KiB gzip chunk can become 64 MiB
at once, before any cap could look at it. Here every decoder is asked for at most ``STEP`` bytes at
a time and keeps the rest of its input for the next call; the reader stops pulling pieces as soon
as it has seen enough. Supported: identity, gzip, deflate (zlib or raw), and, where a bounded
decoder is importable, br (Google's ``brotli`` with ``output_buffer_limit``) and zstd (the standard
library's ``compression.zstd``, Python 3.14). ``ACCEPT_ENCODING`` names exactly those, so a
service has no cause to send anything else; anything else raises ``UnsupportedEncoding``.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Iterator
from typing import Any, Protocol

__all__ = ["STEP", "ACCEPT_ENCODING", "BoundedDecoder", "DecodeError", "UnsupportedEncoding"]

STEP = 64 * 1024  # the most one decoder call may produce


class DecodeError(ValueError):
    """The body is not valid in its stated encoding (cut short or garbled on the way)."""


class UnsupportedEncoding(ValueError):
    """The answer names a content encoding that cannot be decoded within a bound here."""


class _Stage(Protocol):
    def decompress(self, data: bytes, limit: int) -> bytes:
        """Take ``data`` (kept until used) and return at most ``limit`` decoded bytes; b"" once
        everything taken so far is decoded."""


class _Identity:
    def __init__(self) -> None:
        self._pending = b""

    def decompress(self, data: bytes, limit: int) -> bytes:
        self._pending += data
        out, self._pending = self._pending[:limit], self._pending[limit:]
        return out


class _Zlib:
    """gzip (``wbits`` 16 + 15) or deflate, zlib-wrapped or raw as servers send both: told apart by
    the first two bytes (a zlib header), and tried raw when a wrapped start fails before any output."""

    HEAD = 64 * 1024  # bytes kept from the start until the first output, to try again raw

    def __init__(self, gzip: bool) -> None:
        self._gzip = gzip
        self._decoder: Any = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzip else None
        self._pending = b""
        self._head: bytes | None = None if gzip else b""  # deflate: what came before any output

    def decompress(self, data: bytes, limit: int) -> bytes:
        data = self._pending + data
        self._pending = b""
        if self._decoder is None:
            if len(data) < 2:
                self._pending = data
                return b""
            cmf, flg = data[0], data[1]
            wrapped = cmf & 0x0F == 8 and (cmf << 8 | flg) % 31 == 0
            self._decoder = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        if self._decoder.eof:  # what follows the end of the stream is not the answer (as httpx)
            return b""
        if self._head is not None:
            self._head = (self._head + data)[: self.HEAD]
        try:
            out: bytes = self._decoder.decompress(data, limit)
        except zlib.error as exc:
            if self._head is None or not self._head:
                raise DecodeError(f"invalid {'gzip' if self._gzip else 'deflate'} data ({exc})") from None
            head, self._head = self._head, None  # a raw stream that looked wrapped: once more, raw
            self._decoder = zlib.decompressobj(-zlib.MAX_WBITS)
            try:
                out = self._decoder.decompress(head, limit)
            except zlib.error as raw_exc:
                raise DecodeError(f"invalid deflate data ({raw_exc})") from None
        if out:
            self._head = None
        self._pending = self._decoder.unconsumed_tail
        return out


class _Brotli:
    """Google's ``brotli`` binding with ``output_buffer_limit`` (it keeps unused input itself)."""

    def __init__(self, module: Any) -> None:
        self._decoder = module.Decompressor()
        self._pending = b""
        self._error = getattr(module, "error", Exception)

    def decompress(self, data: bytes, limit: int) -> bytes:
        self._pending += data
        if self._decoder.is_finished():
            return b""
        feed = b""
        if self._decoder.can_accept_more_data():
            feed, self._pending = self._pending, b""
        try:
            return bytes(self._decoder.process(feed, output_buffer_limit=limit))
        except self._error as exc:
            raise DecodeError(f"invalid br data ({exc})") from None


class _Zstd:
    """The standard library's ``compression.zstd`` (``max_length``; it keeps unused input itself)."""

    def __init__(self, module: Any) -> None:
        self._decoder = module.ZstdDecompressor()
        self._error = module.ZstdError

    def decompress(self, data: bytes, limit: int) -> bytes:
        if self._decoder.eof:
            return b""
        try:
            return bytes(self._decoder.decompress(data, limit))
        except self._error as exc:
            raise DecodeError(f"invalid zstd data ({exc})") from None


def _module(name: str, needs: str) -> Any:
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    return module if hasattr(module, needs) else None


def _brotli() -> Any:
    module = _module("brotli", "Decompressor")
    return module if module is not None and hasattr(module.Decompressor, "can_accept_more_data") else None


_BROTLI = _brotli()
_ZSTD = _module("compression.zstd", "ZstdDecompressor")

ACCEPT_ENCODING = ", ".join(
    name for name, available in (("gzip", True), ("deflate", True), ("br", _BROTLI), ("zstd", _ZSTD)) if available
)


def _stage(encoding: str) -> _Stage:
    if encoding in ("gzip", "x-gzip"):
        return _Zlib(gzip=True)
    if encoding == "deflate":
        return _Zlib(gzip=False)
    if encoding == "br" and _BROTLI is not None:
        return _Brotli(_BROTLI)
    if encoding == "zstd" and _ZSTD is not None:
        return _Zstd(_ZSTD)
    raise UnsupportedEncoding(f"the answer's content encoding {encoding!r} is not one of {ACCEPT_ENCODING}")


class BoundedDecoder:
    """The decoder for a ``Content-Encoding`` header (a list, applied in order: undone in reverse).

    ``feed(raw)`` yields decoded pieces of at most ``STEP`` bytes; stop iterating at any time and
    nothing more is decoded (the rest of the input waits in the decoders). Raises ``DecodeError``
    for a body that is not valid in its encoding, ``UnsupportedEncoding`` (at construction) for
    an encoding not listed in ``ACCEPT_ENCODING``.
    """

    def __init__(self, content_encoding: str) -> None:
        names = [part.strip().lower() for part in content_encoding.split(",")]
        self._stages = [_stage(name) for name in reversed(names) if name and name != "identity"]
        if not self._stages:
            self._stages = [_Identity()]

    def feed(self, raw: bytes) -> Iterator[bytes]:
        return self._pieces(0, raw)

    def _pieces(self, index: int, data: bytes) -> Iterator[bytes]:
        stage = self._stages[index]
        out = stage.decompress(data, STEP)
        while out:
            if index + 1 == len(self._stages):
                yield out
            else:
                yield from self._pieces(index + 1, out)
            out = stage.decompress(b"", STEP)
