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
  front of the local service (a process of its own) strict at 600/min in a sliding minute (answers
  0.3-0.7 s); 30 clients offering 1200/min between them for 90 s (each a request every 1.5 s, round
  robin over the gateways, whatever came back), each honouring a 429's or 503's ``Retry-After`` and
  asking again: 429s the service sent, the most starts at the service in any 1/10/60 s against
  ceil(600 w/60)+1, and the same in the budget's ledger (the time each start went, by its gateway,
  per tenth of a second: read from Redis as the run goes), the plan's use while the offer exceeded
  it, and every request's end (200, in the end).
- **litellm**: the same load through three LiteLLM proxy processes (``--litellm DIR``: a venv with
  ``litellm[proxy]``; not a dependency) sharing a Redis of their own, the deployment's ``rpm`` at
  600, in front of an OpenAI-style shim of the same service (``benchmarks/keys.py``): 429s at the
  service, refusals to the clients, the most starts in any 1/10/60 s.
- **outage**: the replicas' load for ``--outage-seconds`` (40), the budget's Redis killed 15 s in and
  started again (empty) 10 s later; every other request with ``Batchsum-Max-Wait: 3``: starts at the
  service while Redis was down, 503s (each with its ``Retry-After``) and 429s to the clients, every
  request's end.

- **live** (the live lane's must-show), on the machine's budget and on Redis (``--budgets``), and beside
  each the same with the lane off (``--interactive-share 0``): a CLI job of 1200 texts at ``--rpm
  600`` and a gateway at ``--rpm 600`` on the same budget, a client sending one request every 2 s for
  60 s through it: how soon each live request reached the service after it was sent (p50, p95, the
  most), the whole's time against (1200 + 30) / 600 minutes, 429s.

By hand: ``python -m benchmarks.gateway [--parts latency replicas litellm outage live] [--requests 2000]
[--clients 32] [--seconds 20] [--litellm /tmp/litellm-venv] [--budgets machine redis] [--json F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from benchmarks.far_budget import busiest, free_port
from benchmarks.outage import OwnRedis

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
    """One kept-alive HTTP/1.1 connection: a POST of JSON (with ``key`` as its bearer, and ``headers``),
    its answer's status and seconds."""

    def __init__(self, host: str, port: int, key: str = KEY, headers: dict[str, str] | None = None) -> None:
        self.host, self.port, self.key = host, port, key
        self.extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.retry_after: float | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, float]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {self.key}\r\n{self.extra}"
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

    async def post_waiting(self, path: str, body: bytes) -> tuple[int, float, float | None]:
        """``post``, and the answer's Retry-After in seconds (None when it has none)."""
        self.retry_after = None
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


def serve_local(rpm: int) -> None:
    """The local service strict at ``rpm`` in a sliding minute (answers 0.3-0.7 s), in this process until
    stdin closes (``Upstream``): its address on the first line, then at the end one JSON line: when it
    admitted each request, when each marked request (``MARK`` in its body) arrived, its counts (the
    monotonic clock, the same in every process of the machine)."""
    from batchsum.local import Faults
    from batchsum.local.app import create_app
    from batchsum.local.server import ThreadServer
    from batchsum.local.state import ServiceState

    state = ServiceState([KEY], rpm=rpm, faults=Faults(latency=0.3, latency_spread=0.4))
    app = create_app(state)
    marked: list[tuple[float, str]] = []

    async def watched(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        arrived, messages = time.monotonic(), []
        while True:  # the body read whole, then handed to the app as it came
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        text = b"".join(m.get("body", b"") for m in messages)
        if MARK.encode() in text:
            marked.append((arrived, text.decode(errors="replace").split(MARK, 1)[1].split(":", 1)[0]))
        replay = iter(messages)

        async def again() -> Any:
            return next(replay, None) or await receive()

        await app(scope, again, send)

    server = ThreadServer(watched, name="bench-upstream").start()
    print(server.url, flush=True)
    sys.stdin.read()
    stats = state.stats()
    print(json.dumps({"admitted": list(state.admitted), "marked": marked, "stats": stats}), flush=True)
    server.stop()


MARK = "Live request "  # a request the service notes the arrival of (``serve_local``)


class Upstream:
    """``serve_local`` in a process of its own, so that the clients' loop never delays its clock."""

    def __init__(self, rpm: int = 600) -> None:
        code = f"from benchmarks.gateway import serve_local; serve_local({rpm})"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().strip()
        self.port = int(self.url.rsplit(":", 1)[1])

    def finish(self) -> dict[str, Any]:
        """What it saw (``serve_local``), once it stops."""
        out, _ = self.process.communicate(timeout=60)
        return dict(json.loads(out.strip().splitlines()[-1]))


class LedgerWatch:
    """The budget's ledger on Redis read every 20 s as a run goes (each second's counts live 3 minutes):
    the starts each tenth of a second, as every process told them (the time each went, by its pacer)."""

    def __init__(self, port: int) -> None:
        import threading

        import redis as redis_client

        self.redis = redis_client.Redis(port=port)
        self.seconds: dict[bytes, dict[bytes, bytes]] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for name in self.redis.scan_iter(match="batchsum:budget:*:counts:*", count=500):
                self.seconds[name] = self.redis.hgetall(name)
        except Exception:  # noqa: BLE001 - Redis down (the outage part): read again later
            pass

    def _watch(self) -> None:
        while not self.done.wait(20.0):
            self._read()

    def starts(self) -> dict[int, int]:
        """The last read, then each tick's starts (tick: a tenth of a second of the Unix time, Redis'
        clock), every key's together."""
        self._read()
        self.done.set()
        ticks: dict[int, int] = {}
        for name, fields in self.seconds.items():
            second = int(name.rsplit(b":", 1)[1])
            for d in range(10):
                ticks[second * 10 + d] = ticks.get(second * 10 + d, 0) + int(fields.get(f"s{d}".encode(), 0))
        return ticks

    @staticmethod
    def most(ticks: dict[int, int], seconds: float) -> int:
        """The most starts in any ``seconds`` of consecutive ticks."""
        width = round(10 * seconds)
        if not ticks:
            return 0
        row = [ticks.get(t, 0) for t in range(min(ticks), max(ticks) + 1)]
        return max(sum(row[i : i + width]) for i in range(max(1, len(row) - width + 1)))


def busiest_second(admitted: list[float], ticks: dict[int, int], wall: float) -> dict[str, Any]:
    """The busiest second at the service (``admitted``: the monotonic clock) beside the ledger's ticks
    over the same time (``wall``: the Unix time less the monotonic clock, the machine's), from 0.3 s
    before it: what the gateways' pacers sent then, as each told its budget."""
    admitted = sorted(admitted)
    counts = [bisect.bisect_left(admitted, t + 1.0) - i for i, t in enumerate(admitted)]
    at = admitted[max(range(len(counts)), key=counts.__getitem__)]
    first = math.floor((at + wall) * 10) - 3
    return {
        "at_the_service": max(counts),
        "ledger_ticks_from_0.3_s_before": [ticks.get(t, 0) for t in range(first, first + 14)],
    }


async def offered(
    urls: list[tuple[str, int]],
    clients: int,
    per_minute: float,
    seconds: float,
    *,
    path: str = "/api/user/summarize",
    make: Any = body,
    key: str = KEY,
    patience: Any = lambda n: None,
) -> dict[str, Any]:
    """``clients`` offering ``per_minute`` between them for ``seconds`` (each request a task of its own,
    round robin over ``urls``: ``make(n)`` its body), each asking again after a 429's or 503's
    Retry-After (1 s without one) until answered; ``patience(n)``: its ``Batchsum-Max-Wait`` (None: none)."""
    ends: dict[int, int] = {}
    refused = {"429": 0, "503": 0, "without Retry-After": 0}
    history: dict[int, list[tuple[float, int]]] = {}  # each request's answers: (when, status)
    every = 60.0 * clients / per_minute

    async def one(n: int) -> None:
        wait_header, seen = patience(n), history.setdefault(n, [(time.monotonic(), 0)])
        headers = {} if wait_header is None else {"Batchsum-Max-Wait": str(wait_header)}
        while True:  # a connection of its own each time: a Retry-After's wait outlasts a kept-alive one
            connection = Connection(*urls[n % len(urls)], key=key, headers=headers)
            try:
                status, _, wait = await connection.post_waiting(path, make(n))
            except OSError:  # a connection refused or reset on a loaded machine: asked again
                status, wait = 0, 1.0
            finally:
                connection.close()
            seen.append((time.monotonic(), status))
            if status not in (0, 429, 503):
                ends[status] = ends.get(status, 0) + 1
                return
            refused[str(status)] = refused.get(str(status), 0) + 1
            if wait is None:
                refused["without Retry-After"] += 1
            await asyncio.sleep(1.0 if wait is None else wait)

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
        "history": history,
        "began": began,
        "offer_ended": began + seconds,
        "ended": time.monotonic(),
    }


def at_the_service(seen: dict[str, Any], got: dict[str, Any], rpm: int = 600) -> dict[str, Any]:
    """What the service saw of an offered load: its 429s, the most starts in any 1/10/60 s against
    ceil(rpm w/60)+1, the plan's use while the offer exceeded it (from 5 s after the first start)."""
    admitted = sorted(seen["admitted"])
    stats = seen["stats"]
    first = admitted[0]
    busy = [t for t in admitted if first + 5 <= t <= got["offer_ended"]]
    return {
        "requests": got["requests"],
        "ends": got["ends"],
        "refusals_to_clients": {k: v for k, v in got["refusals"].items() if v},
        "upstream_429": stats["by_status"].get("429", 0),
        "answered_twice": stats["answered_twice"],
        "most_starts": {f"{w}s": busiest(admitted, w) for w in (1, 10, 60)},
        "allowed": {f"{w}s": math.ceil(rpm * w / 60) + 1 for w in (1, 10, 60)},
        "use_while_offered": round(len(busy) / ((got["offer_ended"] - first - 5) * rpm / 60), 3),
        "seconds_to_the_last": round(got["ended"] - got["began"], 1),
    }


def replicas(args: argparse.Namespace) -> dict[str, Any]:
    """Three gateways on one Redis budget (the issue's must-show), the budget's ledger beside the service."""
    with tempfile.TemporaryDirectory() as folder:
        redis = OwnRedis(folder)
        redis.start()
        upstream, gateways, ledger = Upstream(600), [], LedgerWatch(redis.port)
        try:
            flags = ["--budget", redis.url, "--rpm", "600", "--max-queue-wait", "30"]
            gateways = [start_gateway(upstream.port, folder, *flags, upstream_url=upstream.url) for _ in range(3)]
            urls = [("127.0.0.1", gateway_port) for _, gateway_port in gateways]
            got = asyncio.run(offered(urls, 30, 1200.0, args.offer_seconds))
        finally:
            for process, _ in gateways:
                process.terminate()
                process.wait(60)
            seen = upstream.finish()
            ticks = ledger.starts()
            redis.stop()
    out = at_the_service(seen, got)
    out["ledger_most_starts"] = {f"{w}s": LedgerWatch.most(ticks, w) for w in (1, 1.1, 10, 60)}
    out["busiest_second"] = busiest_second(seen["admitted"], ticks, time.time() - time.monotonic())
    return out


def litellm(args: argparse.Namespace) -> dict[str, Any]:
    """The replicas' load through three LiteLLM proxy processes on one Redis, the deployment at 600 a
    minute, in front of an OpenAI-style shim of the same service (``benchmarks.keys.shim``)."""
    from types import SimpleNamespace

    from benchmarks.keys import shim

    venv = Path(args.litellm)
    master = "sk-" + os.urandom(16).hex()
    with tempfile.TemporaryDirectory() as folder:
        redis = OwnRedis(folder)
        redis.start()
        upstream, proxies = Upstream(600), []
        url, server = shim(SimpleNamespace(url=upstream.url))
        config = Path(folder) / "litellm.yaml"
        config.write_text(
            textwrap.dedent(f"""
            model_list:
              - model_name: summarize
                litellm_params: {{model: openai/summarize, api_base: "{url}", api_key: {KEY}, rpm: 600}}
            router_settings:
              routing_strategy: usage-based-routing-v2
              enable_pre_call_checks: true
              redis_host: 127.0.0.1
              redis_port: {redis.port}
            litellm_settings: {{telemetry: false}}
            """)
        )
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": master}
        env |= {"LITELLM_TELEMETRY": "False", "NO_DOCS": "True", "DISABLE_ADMIN_UI": "True"}
        try:
            ports = [free_port() for _ in range(3)]
            for port in ports:
                argv = [str(venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1"]
                argv += ["--port", str(port), "--num_workers", "1"]
                log = open(Path(folder) / f"litellm-{port}.log", "w")  # noqa: SIM115 - closed with the folder
                proxies.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
            for port in ports:
                wait_until_up(port, "/health/liveliness")
            urls = [("127.0.0.1", port) for port in ports]
            got = asyncio.run(
                offered(urls, 30, 1200.0, args.offer_seconds, path="/v1/chat/completions", make=chat, key=master)
            )
        finally:
            for process in proxies:
                process.terminate()
                process.wait(60)
            server.should_exit = True
            seen = upstream.finish()
            redis.stop()
    return at_the_service(seen, got)


def chat(n: int) -> bytes:
    return json.dumps(
        {"model": "summarize", "messages": [{"role": "user", "content": f"Request {n}: {TEXT}"}]}
    ).encode()


def wait_until_up(port: int, path: str, seconds: float = 120.0) -> None:
    import urllib.request

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"nothing answered on port {port}")


def outage(args: argparse.Namespace) -> dict[str, Any]:
    """The replicas' load with the budget's Redis killed 15 s in and back (empty) 10 s later; every
    other request willing to wait only 3 s for its turn."""
    with tempfile.TemporaryDirectory() as folder:
        redis = OwnRedis(folder)
        redis.start()
        upstream, gateways = Upstream(600), []
        try:
            flags = ["--budget", redis.url, "--rpm", "600", "--max-queue-wait", "30"]
            gateways = [start_gateway(upstream.port, folder, *flags, upstream_url=upstream.url) for _ in range(3)]
            urls = [("127.0.0.1", gateway_port) for _, gateway_port in gateways]
            down: list[float] = []

            async def load() -> dict[str, Any]:
                async def kill_and_restart() -> None:
                    await asyncio.sleep(15.0)
                    redis.stop()
                    down.append(time.monotonic())
                    await asyncio.sleep(10.0)
                    await asyncio.to_thread(redis.start)
                    down.append(time.monotonic())

                killing = asyncio.ensure_future(kill_and_restart())
                got = await offered(urls, 30, 1200.0, args.outage_seconds, patience=lambda n: 3 if n % 2 else None)
                await killing
                return got

            got = asyncio.run(load())
        finally:
            for process, _ in gateways:
                process.terminate()
                process.wait(60)
            seen = upstream.finish()
            redis.stop()
    out = at_the_service(seen, got)
    killed, back = down
    admitted = sorted(seen["admitted"])
    out["redis_down_seconds"] = round(back - killed, 2)
    out["starts_while_down"] = sum(killed <= t < back for t in admitted)
    out["starts_while_down_seconds_after_the_kill"] = [round(t - killed, 3) for t in admitted if killed <= t < back]
    out["first_start_after"] = round(min((t for t in admitted if t >= back), default=back) - back, 2)
    answers = [(t, status) for seen in got["history"].values() for t, status in seen[1:]]
    out["answered_while_down"] = {
        str(code): sum(killed <= t < back and status == code for t, status in answers) for code in (200, 429, 503)
    }
    waiting = [seen for seen in got["history"].values() if seen[0][0] < back and seen[-1][0] >= killed]
    out["waiting_through_the_outage"] = {
        "requests": len(waiting),
        "answered 200 without a refusal": sum(len(seen) == 2 and seen[1][1] == 200 for seen in waiting),
        "given a 503 first": sum(any(status == 503 for _, status in seen[1:]) for seen in waiting),
    }
    return out


def live(args: argparse.Namespace) -> dict[str, Any]:
    """The issue's must-show for the live lane, on each budget (``--budgets``) and, beside it, with the
    lane off (``--interactive-share 0``): a CLI job of 1200 texts at ``--rpm 600`` and a gateway at
    ``--rpm 600`` on the same budget, a client sending one request every 2 s for 60 s through it,
    in front of the service strict at 600/min (answers 0.3-0.7 s). The gateway serves the key already
    (one request before the job: its run for the key open, as a sidecar's is), the job 8 s under way
    when the client begins."""
    import pandas as pd

    results: dict[str, Any] = {}
    for budget in args.budgets:
        for share in args.live_shares:
            with tempfile.TemporaryDirectory() as folder:
                redis = OwnRedis(folder) if budget == "redis" else None
                if redis is not None:
                    redis.start()
                where = redis.url if redis is not None else "machine"
                texts = [f"Job text {i}: {TEXT}" for i in range(1200)]
                pd.DataFrame({"text": texts}).to_parquet(f"{folder}/in.parquet")
                upstream, gateway_process = Upstream(600), None
                try:
                    flags = ["--budget", where, "--rpm", "600", "--interactive-share", share]
                    gateway_process, port = start_gateway(upstream.port, folder, *flags, upstream_url=upstream.url)
                    asyncio.run(ask_once(port))  # serving the key already
                    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSUM_")}
                    env |= {"XDG_CACHE_HOME": folder, "PYTHONPATH": str(ROOT), "BATCHSUM_API_KEY": KEY}
                    env |= {"BATCHSUM_BASE_URL": upstream.url}
                    argv = [sys.executable, "-m", "batchsum", "summarize", f"{folder}/in.parquet"]
                    argv += ["-o", f"{folder}/out.parquet", "--column", "text", "--rpm", "600", "--budget", where]
                    job = subprocess.Popen([*argv, "--quiet"], env=env, stderr=subprocess.PIPE, text=True)
                    time.sleep(8.0)  # the job under way (its start-up, its first starts)
                    sent = asyncio.run(live_client(port, 30, 2.0))
                    _, job_err = job.communicate(timeout=900)
                finally:
                    if gateway_process is not None:
                        gateway_process.terminate()
                        gateway_process.wait(60)
                    seen = upstream.finish()
                    if redis is not None:
                        redis.stop()
                results[f"{budget}, interactive share {share}"] = live_figures(seen, sent, job.returncode, job_err)
                print(json.dumps(results), flush=True)
    return results


async def ask_once(port: int) -> int:
    """One request through the gateway at ``port``: its status."""
    connection = Connection("127.0.0.1", port)
    try:
        return (await connection.post("/api/user/summarize", body(-1)))[0]
    finally:
        connection.close()


async def live_client(port: int, count: int, every: float) -> dict[int, tuple[float, int]]:
    """``count`` requests, one every ``every`` seconds, each on a connection of its own: when each was
    sent (the monotonic clock) and its status."""
    sent: dict[int, tuple[float, int]] = {}

    async def one(n: int) -> None:
        connection = Connection("127.0.0.1", port)
        try:
            at = time.monotonic()
            text = json.dumps({"text": f"{MARK}{n}: {TEXT}", "mode": 1}).encode()
            status, _ = await connection.post("/api/user/summarize", text)
            sent[n] = (at, status)
        finally:
            connection.close()

    began, tasks = time.monotonic(), []
    for n in range(count):
        await asyncio.sleep(max(0.0, began + n * every - time.monotonic()))
        tasks.append(asyncio.ensure_future(one(n)))
    await asyncio.gather(*tasks)
    return sent


def live_figures(
    seen: dict[str, Any], sent: dict[int, tuple[float, int]], code: int | None, err: str
) -> dict[str, Any]:
    """Each live request's reach (its arrival at the service less its sending) at p50/p95/max, the
    whole's time against (1200 + 30) / 600 minutes, 429s, the job's end."""
    arrived = {int(n): at for at, n in seen["marked"]}
    reach = sorted(arrived[n] - at for n, (at, _) in sent.items() if n in arrived)
    admitted = sorted(seen["admitted"])
    ideal = (len(admitted) - 1) * 60 / 600
    return {
        "live_requests": len(sent),
        "live_statuses": sorted({status for _, status in sent.values()}),
        "reach_p50_s": round(statistics.median(reach), 4),
        "reach_p95_s": round(percentile(reach, 0.95), 4),
        "reach_max_s": round(reach[-1], 4),
        "starts": len(admitted),
        "first_to_last_start_s": round(admitted[-1] - admitted[0], 2),
        "ideal_s": round(ideal, 2),
        "over_ideal": round((admitted[-1] - admitted[0]) / ideal - 1, 4),
        "upstream_429": seen["stats"]["by_status"].get("429", 0),
        "most_starts": {f"{w}s": busiest(admitted, w) for w in (1, 10, 60)},
        "job_exit": code,
        "job_last_line": err.strip().splitlines()[-1] if err.strip() else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parts = ["latency", "replicas", "litellm", "outage", "live"]
    parser.add_argument("--parts", nargs="+", default=["latency", "replicas"], choices=parts)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--offer-seconds", type=float, default=90.0)
    parser.add_argument("--outage-seconds", type=float, default=40.0)
    parser.add_argument(
        "--live-shares", nargs="+", default=["0.25", "0"], metavar="SHARE", help="--interactive-share values (live)"
    )
    parser.add_argument("--litellm", default="/tmp/litellm-venv", metavar="DIR", help="a venv with litellm[proxy]")
    parser.add_argument("--budgets", nargs="+", default=["machine", "redis"], choices=["machine", "redis"])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results: dict[str, Any] = {"load_at_start": os.getloadavg()[0]}
    if "latency" in args.parts:
        results.update(latency_and_throughput(args))
    for name, part in (("replicas", replicas), ("litellm", litellm), ("outage", outage), ("live", live)):
        if name in args.parts:
            results[name] = part(args)
            print(json.dumps({name: results[name]}, indent=1), flush=True)
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
