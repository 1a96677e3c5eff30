"""Answers are bounded by their decoded size, while they are decoded: a small compressed answer
that inflates to hundreds of megabytes (a decompression bomb) fails its row as ``bad_response``
having cost a few megabytes, in both twins, for every encoding the client accepts.

A real HTTP server on loopback sends the bombs (a mock transport's response is decoded whole by
httpx before the client sees it, which is the very thing under test)."""

from __future__ import annotations

import asyncio
import gzip
import http.server
import importlib.util
import json
import threading
import tracemalloc
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import batchsum
from batchsum.engine import summarize_stream
from batchsum.errors import APIResponseValidationError, ServerError
from batchsum.service.inflate import ACCEPT_ENCODING, STEP, BoundedDecoder, DecodeError
from tests.support import KEY, article

INFLATED = 128 * 1024 * 1024  # what each bomb inflates to
PEAK_LIMIT = 24 * 1024 * 1024  # far below it: the 2 MiB cap, one step, the compressed body, httpx


def _zeros_compressed(compressor: Any) -> bytes:
    block = bytes(1024 * 1024)
    parts = [compressor.compress(block) for _ in range(INFLATED // len(block))]
    return b"".join(parts) + compressor.flush()


def _bomb(encoding: str) -> bytes:
    if encoding == "gzip":
        return _zeros_compressed(zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS))
    if encoding == "deflate":
        return _zeros_compressed(zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS))
    if encoding == "deflate-raw":
        return _zeros_compressed(zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS))
    if encoding == "gzip, gzip":  # a bomb inside a bomb: each layer is decoded in steps
        return gzip.compress(_bomb("gzip"), 9)
    if encoding == "br":
        import brotli

        return bytes(brotli.compress(bytes(INFLATED), quality=5))
    if encoding == "zstd":
        from compression import zstd  # type: ignore[import-not-found]

        return bytes(zstd.compress(bytes(INFLATED)))
    raise AssertionError(encoding)


BOMBS = ["gzip", "deflate", "deflate-raw", "gzip, gzip", "br", "zstd"]


def _available(encoding: str) -> bool:
    if encoding == "br":
        return "br" in ACCEPT_ENCODING and importlib.util.find_spec("brotli") is not None
    if encoding == "zstd":
        return "zstd" in ACCEPT_ENCODING
    return True


class _Server:
    """A loopback HTTP server answering every POST with ``answer`` (status, headers, body)."""

    def __init__(self) -> None:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                server.accept_encoding = self.headers.get("accept-encoding")
                status, headers, body = server.answer
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client stopped reading: as it should
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.answer: tuple[int, dict[str, str], bytes] = (200, {}, b"")
        self.accept_encoding: str | None = None

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that stops reading a bomb resets the connection: as it should

        self._http = Quiet(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture(scope="module")
def server():
    running = _Server()
    yield running
    running.close()


_BOMB_CACHE: dict[str, bytes] = {}


def bomb(encoding: str) -> bytes:
    if not _available(encoding):
        pytest.skip(f"no bounded {encoding} decoder here (accepted: {ACCEPT_ENCODING})")
    if encoding not in _BOMB_CACHE:
        _BOMB_CACHE[encoding] = _bomb(encoding)
    return _BOMB_CACHE[encoding]


def _header(encoding: str) -> str:
    return "deflate" if encoding == "deflate-raw" else encoding


def _peak(call: Any) -> tuple[BaseException | None, int]:
    """What ``call()`` raised, and the peak of memory traced while it ran."""
    tracemalloc.start()
    try:
        try:
            call()
        except Exception as exc:  # the error is the result under test
            return exc, tracemalloc.get_traced_memory()[1]
        return None, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("twin", ["sync", "async"])
@pytest.mark.parametrize("encoding", BOMBS)
def test_a_decompression_bomb_fails_bad_response_within_a_few_megabytes(server, encoding, twin):
    body = bomb(encoding)
    server.answer = (200, {"content-type": "application/json", "content-encoding": _header(encoding)}, body)
    text = article(20)

    def sync() -> None:
        with batchsum.Client(KEY, server.url, max_retries=0) as client:
            client.summarize(text)

    def async_() -> None:
        async def go() -> None:
            async with batchsum.AsyncClient(KEY, server.url, max_retries=0) as client:
                await client.summarize(text)

        asyncio.run(go())

    error, peak = _peak(sync if twin == "sync" else async_)
    assert isinstance(error, APIResponseValidationError), error
    assert error.code == "bad_response" and not error.transient and "MiB" in error.message
    assert peak < PEAK_LIMIT, f"{peak / 2**20:.1f} MiB traced for a {len(body)} byte {encoding} bomb"


def test_an_error_answer_that_is_a_bomb_is_cut_at_its_cap(server):
    server.answer = (500, {"content-type": "text/plain", "content-encoding": "gzip"}, bomb("gzip"))

    def call() -> None:
        with batchsum.Client(KEY, server.url, max_retries=0) as client:
            client.summarize(article(20))

    error, peak = _peak(call)
    assert isinstance(error, ServerError) and error.status_code == 500
    assert peak < PEAK_LIMIT


def test_a_batch_answered_by_bombs_fails_each_row_as_bad_response(server):
    server.answer = (200, {"content-type": "application/json", "content-encoding": "gzip"}, bomb("gzip"))

    async def go() -> list[Any]:
        async with batchsum.AsyncClient(KEY, server.url, max_retries=0) as client:
            return [r async for r in summarize_stream([article(15, seed=i) for i in range(4)], client, rpm=0)]

    results = asyncio.run(go())
    assert [(r.status, r.error) for r in results] == [("failed", "bad_response")] * 4


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "deflate-raw", "gzip, gzip", "identity", ""])
def test_an_ordinary_compressed_answer_is_read(server, encoding):
    payload = json.dumps({"result": "a fine summary " * 50}).encode()
    body = {
        "gzip": lambda: gzip.compress(payload),
        "deflate": lambda: zlib.compress(payload),
        "deflate-raw": lambda: zlib.compress(payload, wbits=-zlib.MAX_WBITS),
        "gzip, gzip": lambda: gzip.compress(gzip.compress(payload)),
        "identity": lambda: payload,
        "": lambda: payload,
    }[encoding]()
    headers = {"content-type": "application/json"}
    if encoding:
        headers["content-encoding"] = _header(encoding)
    server.answer = (200, headers, body)
    with batchsum.Client(KEY, server.url, max_retries=0) as client:
        assert client.summarize(article(20)) == "a fine summary " * 50
    assert server.accept_encoding == ACCEPT_ENCODING  # only what is decoded in bounded steps is asked for


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_an_unknown_encoding_fails_bad_response_and_a_garbled_one_is_transient(server, twin):
    def summarize() -> None:
        if twin == "sync":
            with batchsum.Client(KEY, server.url, max_retries=0) as client:
                client.summarize(article(20))
            return

        async def go() -> None:
            async with batchsum.AsyncClient(KEY, server.url, max_retries=0) as client:
                await client.summarize(article(20))

        asyncio.run(go())

    server.answer = (200, {"content-encoding": "compress"}, b'{"result": "x"}')
    with pytest.raises(APIResponseValidationError) as unknown:
        summarize()
    assert not unknown.value.transient and "'compress'" in unknown.value.message
    server.answer = (200, {"content-encoding": "gzip"}, b"\x1f\x8b not gzip at all")
    with pytest.raises(APIResponseValidationError) as garbled:
        summarize()
    assert garbled.value.transient
    server.answer = (503, {"content-encoding": "compress"}, b"?")
    with pytest.raises(ServerError):
        summarize()


@given(
    data=st.binary(max_size=300_000) | st.builds(lambda n: bytes(n), st.integers(0, 400_000)),
    encoding=st.sampled_from(["gzip", "deflate", "deflate-raw", "identity"]),
    cuts=st.lists(st.integers(0, 2000), max_size=8),
)
def test_the_bounded_decoder_gives_back_what_was_encoded_in_pieces_of_at_most_a_step(data, encoding, cuts):
    encoded = {
        "gzip": lambda: gzip.compress(data),
        "deflate": lambda: zlib.compress(data),
        "deflate-raw": lambda: zlib.compress(data, wbits=-zlib.MAX_WBITS),
        "identity": lambda: data,
    }[encoding]()
    decoder = BoundedDecoder(_header(encoding))
    out = bytearray()
    start = 0
    for cut in sorted(cuts) + [len(encoded)]:
        for piece in decoder.feed(encoded[start : max(start, cut)]):
            assert 0 < len(piece) <= STEP
            out += piece
        start = max(start, cut)
    assert bytes(out) == data


def test_garbage_in_a_stated_encoding_is_a_decode_error():
    with pytest.raises(DecodeError):
        list(BoundedDecoder("gzip").feed(b"\x1f\x8b\x08 definitely not"))
