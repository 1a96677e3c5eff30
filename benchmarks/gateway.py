"""What ``batchsum gateway`` adds to a request, and how many one gateway process holds (issue 54).

A fast upstream (a bare asyncio HTTP server answering every summarize request at once with a fixed
``{"result": ...}``, in a process of its own), ``batchsum gateway`` in front of it (its own process:
keys passed through, the machine's budget and answer store, ``--rpm 600000`` so that the key always
has room, and ``--store none`` beside it), and clients in this process speaking plain HTTP/1.1 on
kept-alive connections (a few lines of asyncio: a client's own CPU is kept off the gateway's cores).

- **latency**: one client, ``--requests`` distinct texts one after another, each asked directly of
  the upstream and through the gateway in turn (interleaved): p50 and p99 of each, the difference
  of the medians (what the gateway adds).
- **throughput**: ``--clients`` connections sending as fast as they are answered for ``--seconds``:
  requests a second, and the gateway process's CPU per request (its user + system time over the
  requests), so requests a second per core is 1000 / (CPU ms per request).

- **replicas** (the issue's must-show): three gateways on one ``redis://`` budget at ``--rpm 600``, in
  front of the local service strict at 600/min in a sliding minute (answers 0.3-0.7 s); 30 clients
  offering 1200/min between them for 90 s (each a request every 1.5 s, round robin over the
  gateways, whatever came back), each honouring a 429's or 503's ``Retry-After`` and asking again:
  429s the service sent, the most starts at the service in any 1/10/60 s against ceil(600 w/60),
  the plan's use while the offer exceeded it, and every request's end (200, in the end).

By hand: ``python -m benchmarks.gateway [--parts latency replicas] [--requests 2000] [--clients 32]
[--seconds 20] [--json F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEY = "bench-gateway-key-0123456789"
TEXT = "The council approved the new budget on Tuesday after a long debate about schools, roads and the harbour."

UPSTREAM = textwrap.dedent("""
    import asyncio, socket, sys
    BODY = b'{"result": "The council approved the new budget."}'
    ANSWER = b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\ncontent-length: %d\\r\\n\\r\\n%s" % (len(BODY), BODY)

    class Upstream(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buffer = transport, b""
        def data_received(self, data):
            self.buffer += data
            while True:
                head, sep, rest = self.buffer.partition(b"\\r\\n\\r\\n")
                if not sep:
                    return
                length = 0
                for line in head.split(b"\\r\\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if len(rest) < length:
                    return
                self.buffer = rest[length:]
                self.transport.write(ANSWER)

    async def main():
        sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(1024)
        print(sock.getsockname()[1], flush=True)
        server = await asyncio.get_running_loop().create_server(Upstream, sock=sock)
        await server.serve_forever()
    asyncio.run(main())
""")


class Connection:
    """One kept-alive HTTP/1.1 connection: a POST of JSON, its answer's status and seconds."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.retry_after = 1.0

    async def post(self, path: str, body: bytes) -> tuple[int, float]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        began = time.perf_counter()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionResetError("the server closed the connection")
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
            elif line.lower().startswith(b"retry-after:"):
                self.retry_after = float(line.split(b":")[1])
        await self.reader.readexactly(length)
        return int(status_line.split()[1]), time.perf_counter() - began

    async def post_waiting(self, path: str, body: bytes) -> tuple[int, float, float]:
        """``post``, and the answer's Retry-After in seconds (1 when it has none)."""
        self.retry_after = 1.0
        status, seconds = await self.post(path, body)
        return status, seconds, self.retry_after

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def body(n: int) -> bytes:
    return json.dumps({"text": f"Request {n}: {TEXT}", "mode": 1}).encode()


def cpu_of(pid: int) -> float:
    """A process's user + system CPU seconds so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_gateway(
    upstream: int, cache: str, *flags: str, upstream_url: str | None = None
) -> tuple[subprocess.Popen[str], int]:
    """``batchsum gateway`` in a process of its own (keys passed through, at ``--rpm 600000`` unless
    ``flags`` say): the process and its port, from its first line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSUM_")}
    env |= {"XDG_CACHE_HOME": cache, "PYTHONPATH": str(ROOT)}
    url = upstream_url or f"http://127.0.0.1:{upstream}"
    argv = ["gateway", "--upstream", url, "--port", "0", "--rpm", "600000", *flags]
    process = subprocess.Popen([sys.executable, "-m", "batchsum", *argv], env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    return process, int(line.split()[3].rsplit(":", 1)[1])


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(share * len(ordered) + 0.999999) - 1)]


async def latency(upstream: int, gateway: int, requests: int) -> dict[str, Any]:
    direct, through = Connection("127.0.0.1", upstream), Connection("127.0.0.1", gateway)
    times: dict[str, list[float]] = {"direct": [], "gateway": []}
    for n in range(50):  # warm: connections made, the key proven, the run opened
        await direct.post("/api/user/summarize", body(-n - 1))
        await through.post("/api/user/summarize", body(-n - 1))
    for n in range(requests):
        status, seconds = await direct.post("/api/user/summarize", body(n))
        times["direct"].append(seconds)
        status, seconds = await through.post("/api/user/summarize", body(1_000_000 + n))
        assert status == 200, status
        times["gateway"].append(seconds)
    direct.close()
    through.close()
    out = {
        name: {"p50_ms": 1000 * statistics.median(v), "p99_ms": 1000 * percentile(v, 0.99)} for name, v in times.items()
    }
    out["added_p50_ms"] = out["gateway"]["p50_ms"] - out["direct"]["p50_ms"]
    out["added_p99_ms"] = out["gateway"]["p99_ms"] - out["direct"]["p99_ms"]
    return out


async def throughput(gateway: int, pid: int, clients: int, seconds: float, offset: int) -> dict[str, Any]:
    connections = [Connection("127.0.0.1", gateway) for _ in range(clients)]
    counter = iter(range(offset, offset + 10_000_000))
    statuses: dict[int, int] = {}
    stop = time.monotonic() + seconds

    async def client(connection: Connection) -> None:
        while time.monotonic() < stop:
            status, _ = await connection.post("/api/user/summarize", body(next(counter)))
            statuses[status] = statuses.get(status, 0) + 1

    cpu, began = cpu_of(pid), time.monotonic()
    await asyncio.gather(*(client(c) for c in connections))
    wall, used = time.monotonic() - began, cpu_of(pid) - cpu
    for connection in connections:
        connection.close()
    done = sum(statuses.values())
    return {
        "clients": clients,
        "requests": done,
        "statuses": statuses,
        "per_second": done / wall,
        "gateway_cpu_ms_per_request": 1000 * used / max(1, done),
        "per_second_per_core": done / max(used, 1e-9),
    }


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def busiest(times: list[float], window: float) -> int:
    """The most of ``times`` in any half-open window of ``window`` seconds."""
    times = sorted(times)
    return max((bisect.bisect_left(times, t + window) - i for i, t in enumerate(times)), default=0)


async def offered(urls: list[tuple[str, int]], clients: int, per_minute: float, seconds: float) -> dict[str, Any]:
    """``clients`` offering ``per_minute`` between them for ``seconds`` (each request a task of its own,
    round robin over ``urls``), each asking again after a 429's or 503's Retry-After until answered."""
    ends: dict[int, int] = {}
    refused = {"429": 0, "503": 0}
    every = 60.0 * clients / per_minute

    async def one(n: int) -> None:
        while True:  # a connection of its own each time: a Retry-After's wait outlasts a kept-alive one
            connection = Connection(*urls[n % len(urls)])
            try:
                status, _, wait = await connection.post_waiting("/api/user/summarize", body(n))
            except OSError:  # a connection refused or reset on a loaded machine: asked again
                status, wait = 0, 1.0
            finally:
                connection.close()
            if status not in (0, 429, 503):
                ends[status] = ends.get(status, 0) + 1
                return
            refused[str(status)] = refused.get(str(status), 0) + 1
            await asyncio.sleep(wait)

    async def client(c: int) -> list[asyncio.Task[None]]:
        tasks, n = [], c
        start = time.monotonic() + c * every / clients
        while (at := start + (n // clients) * every) < began + seconds:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            tasks.append(asyncio.ensure_future(one(n)))
            n += clients
        return tasks

    began = time.monotonic()
    tasks = [task for batch in await asyncio.gather(*(client(c) for c in range(clients))) for task in batch]
    await asyncio.gather(*tasks)
    return {
        "requests": len(tasks),
        "ends": ends,
        "refusals": refused,
        "offer_ended": began + seconds,
        "ended": time.monotonic(),
    }


def replicas(args: argparse.Namespace) -> dict[str, Any]:
    import redis as redis_client

    from batchsum.local import Faults, LocalService

    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("needs redis-server: apt-get install redis-server")
    with (
        tempfile.TemporaryDirectory() as folder,
        LocalService([KEY], rpm=600, faults=Faults(latency=0.3, latency_spread=0.4)) as service,
    ):
        port = free_port()
        argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", folder]
        redis = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        gateways = []
        try:
            for _ in range(100):
                try:
                    redis_client.Redis(port=port).ping()
                    break
                except redis_client.ConnectionError:
                    time.sleep(0.05)
            flags = ["--budget", f"redis://127.0.0.1:{port}/0", "--rpm", "600", "--max-queue-wait", "30"]
            gateways = [start_gateway(service.port, folder, *flags, upstream_url=service.url) for _ in range(3)]
            urls = [("127.0.0.1", gateway_port) for _, gateway_port in gateways]
            got = asyncio.run(offered(urls, 30, 1200.0, args.offer_seconds))
        finally:
            for process, _ in gateways:
                process.terminate()
                process.wait(60)
            redis.terminate()
        admitted = list(service.state.admitted)
        stats = service.stats()
    first = min(admitted)
    busy = [t for t in admitted if first + 5 <= t <= got["offer_ended"]]
    return {
        "requests": got["requests"],
        "ends": got["ends"],
        "gateway_refusals": got["refusals"],
        "upstream_429": stats["by_status"].get("429", 0),
        "answered_twice": stats["answered_twice"],
        "most_starts": {f"{w}s": busiest(admitted, w) for w in (1, 10, 60)},
        "allowed": {f"{w}s": math.ceil(600 * w / 60) + 1 for w in (1, 10, 60)},
        "use_while_offered": len(busy) / ((got["offer_ended"] - first - 5) * 10.0),
        "seconds_to_the_last": got["ended"] - (got["offer_ended"] - args.offer_seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", default=["latency", "replicas"], choices=["latency", "replicas"])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--offer-seconds", type=float, default=90.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results: dict[str, Any] = {"load_at_start": os.getloadavg()[0]}
    if "latency" in args.parts:
        results.update(latency_and_throughput(args))
    if "replicas" in args.parts:
        results["replicas"] = replicas(args)
        print(json.dumps({"replicas": results["replicas"]}, indent=1), flush=True)
    results["load_at_end"] = os.getloadavg()[0]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def latency_and_throughput(args: argparse.Namespace) -> dict[str, Any]:
    upstream_process = subprocess.Popen([sys.executable, "-c", UPSTREAM], stdout=subprocess.PIPE, text=True)
    assert upstream_process.stdout is not None
    upstream = int(upstream_process.stdout.readline())
    results: dict[str, Any] = {}
    try:
        for store in ("machine", "none"):
            with tempfile.TemporaryDirectory() as cache:
                process, port = start_gateway(upstream, cache, "--store", store)
                try:
                    cell = {"latency": asyncio.run(latency(upstream, port, args.requests))}
                    cell["throughput"] = asyncio.run(throughput(port, process.pid, args.clients, args.seconds, 10**8))
                finally:
                    process.terminate()
                    process.wait(60)
                results[f"store {store}"] = cell
                print(json.dumps({f"store {store}": cell}, indent=1), flush=True)
    finally:
        upstream_process.terminate()
    return results


if __name__ == "__main__":
    main()
