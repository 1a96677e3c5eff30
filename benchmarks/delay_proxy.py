"""A TCP proxy that puts a network between its clients and a server: every byte waits half of
``--delay`` each way, so each call (a Redis command, a script) takes ``--delay`` more for its round
trip, in order, as a server a zone away would. Used by ``benchmarks/far_budget.py``; by hand:

    python benchmarks/delay_proxy.py --to 127.0.0.1:6379 --delay 0.02 --port 16379

It prints its port on the first line of stdout once it listens, runs until SIGTERM, and then prints
how many Redis commands its clients sent (RESP arrays, counted as they pass).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections import deque

CHUNK = 1 << 16


class Commands:
    """Counts the Redis commands in a client's byte stream (RESP: ``*N`` then N bulk strings)."""

    def __init__(self) -> None:
        self.count = 0
        self._buffer = b""
        self._left = 0  # bulk strings still to skip in the current command

    def feed(self, data: bytes) -> None:
        """Count the commands ``data`` completes; a stream it cannot read is no longer counted (never
        a reason to cut the connection)."""
        if self._left < 0:
            return
        try:
            self._feed(data)
        except ValueError:
            self._left, self._buffer = -1, b""

    def _feed(self, data: bytes) -> None:
        self._buffer += data
        while True:
            if self._left == 0:
                if not self._buffer.startswith(b"*"):
                    end = self._buffer.find(b"\r\n")  # an inline command
                    if end < 0:
                        return
                    self.count += 1 if end > 0 else 0
                    self._buffer = self._buffer[end + 2 :]
                    continue
                end = self._buffer.find(b"\r\n")
                if end < 0:
                    return
                self._left = int(self._buffer[1:end])
                self._buffer = self._buffer[end + 2 :]
                self.count += 1
                continue
            end = self._buffer.find(b"\r\n")
            if end < 0:
                return
            size = int(self._buffer[1:end])
            if len(self._buffer) < end + 2 + size + 2:
                return
            self._buffer = self._buffer[end + 2 + size + 2 :]
            self._left -= 1


CONNECTIONS: list[Commands] = []  # each client connection's count: its byte stream parsed on its own


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, count: Commands | None = None
) -> None:
    """Bytes from ``reader`` to ``writer``, each chunk written ``delay`` after it was read (in order:
    a chunk read later is never written earlier)."""
    loop = asyncio.get_running_loop()
    due: deque[tuple[float, bytes]] = deque()
    arrived = asyncio.Event()
    done = False

    async def read() -> None:
        nonlocal done
        try:
            while chunk := await reader.read(CHUNK):
                if count is not None:
                    count.feed(chunk)
                due.append((loop.time() + delay, chunk))
                arrived.set()
        finally:
            done = True
            arrived.set()

    reading = asyncio.ensure_future(read())
    try:
        while True:
            while not due:
                if done:
                    return
                arrived.clear()
                await arrived.wait()
            at, chunk = due.popleft()
            if (wait := at - loop.time()) > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()
    finally:
        reading.cancel()
        with contextlib.suppress(Exception):
            writer.close()


def _handler(host: str, port: int, delay: float):  # type: ignore[no-untyped-def]
    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(host, port)
        except OSError:
            client_writer.close()
            return
        count = Commands()
        CONNECTIONS.append(count)
        await asyncio.gather(
            _pipe(client_reader, server_writer, delay / 2, count),
            _pipe(server_reader, client_writer, delay / 2),
            return_exceptions=True,
        )

    return handle


async def serve(to: str, delay: float, port: int = 0) -> None:
    host, _, target = to.rpartition(":")
    server = await asyncio.start_server(_handler(host or "127.0.0.1", int(target), delay), "127.0.0.1", port)
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()
    print(sum(count.count for count in CONNECTIONS), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", required=True, help="HOST:PORT of the server")
    parser.add_argument("--delay", type=float, required=True, help="seconds added to each round trip")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.to, args.delay, args.port))


if __name__ == "__main__":
    main()
