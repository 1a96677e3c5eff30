"""Peak memory of a run answered only by decompression bombs, against a run answered normally. Run
by hand:

    python benchmarks/bombs.py --rows 64 --in-flight 16
    python benchmarks/bombs.py --code /path/to/another/checkout   # the same, with that batchsum

A server process on loopback answers every request with one answer: ``normal`` (a small JSON
summary), or a bomb: a gzip (or deflate) body of about 2 MB that inflates to 2 GiB of zeros, as the
issue describes, or that body gzipped again (``gzip-in-gzip``, 9 kB). Careful with ``--code`` of a
batchsum that decodes whole chunks: the nested bomb costs it about 4 GiB per answer. A client process runs ``summarize_stream`` over ROWS distinct texts with the given
number in flight (no retries, no rate limit) and reports its peak resident memory (``ru_maxrss``),
the rows' statuses and its wall time. Each client is a fresh process, so each peak is its own.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

INFLATED = 2 * 1024**3
HERE = Path(__file__).resolve().parent


def make_bomb(path: Path, wbits: int) -> None:
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = bytes(8 * 1024 * 1024)
    with open(path, "wb") as out:
        for _ in range(INFLATED // len(block)):
            out.write(compressor.compress(block))
        out.write(compressor.flush())


def serve(port: int, status: int, encoding: str, body_path: str) -> None:
    """The server process: every POST gets the same answer."""
    body = Path(body_path).read_bytes() if body_path else json.dumps({"result": "A short summary."}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(status)
            self.send_header("content-type", "application/json")
            if encoding:
                self.send_header("content-encoding", encoding)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:  # the client stopped reading the bomb
                pass

        def log_message(self, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128  # 16 connections at once: the default backlog of 5 would refuse some

        def handle_error(self, request: object, client_address: object) -> None:
            pass

    Server(("127.0.0.1", port), Handler).serve_forever()


CLIENT = """
import asyncio, collections, json, resource, sys, time
import batchsum
from batchsum.engine import summarize_stream

url, rows, in_flight = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
texts = [f"Row {i}: " + "the council said the new bridge over the river would open next spring. " * 3
         for i in range(rows)]

async def main():
    async with batchsum.AsyncClient("bench-key", url, max_retries=0) as client:
        return [r async for r in summarize_stream(texts, client, rpm=0, concurrency=in_flight)]

start = time.perf_counter()
results = asyncio.run(main())
wall = time.perf_counter() - start
statuses = collections.Counter(f"{r.status}:{r.error}" if r.error else r.status for r in results)
print(json.dumps({"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "statuses": dict(statuses), "wall": wall, "code": batchsum.__file__}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the server did not start")


def run(answer: str, body: Path | None, args: argparse.Namespace) -> dict[str, object]:
    port = free_port()
    status, encoding = {
        "normal": (200, ""),
        "gzip": (200, "gzip"),
        "deflate": (200, "deflate"),
        "gzip-in-gzip": (200, "gzip, gzip"),
    }[answer]
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), str(status), encoding, str(body or "")],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for(port)
        env = {**os.environ, "PYTHONPATH": args.code, "XDG_CACHE_HOME": tempfile.mkdtemp()}
        out = subprocess.run(
            [sys.executable, "-c", CLIENT, f"http://127.0.0.1:{port}", str(args.rows), str(args.in_flight)],
            env=env,
            cwd=tempfile.gettempdir(),  # not a checkout: "-c" puts the working folder first on sys.path
            check=True,
            capture_output=True,
            text=True,
        )
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--code", default=str(HERE.parent), help="the checkout whose batchsum the client runs")
    parser.add_argument("--answers", default="normal,gzip,deflate,gzip-in-gzip")
    parser.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        port, status, encoding, body = args.serve
        serve(int(port), int(status), encoding, body)
        return
    with tempfile.TemporaryDirectory() as folder:
        bodies: dict[str, Path | None] = {"normal": None}
        for encoding, wbits in (("gzip", 16 + zlib.MAX_WBITS), ("deflate", zlib.MAX_WBITS)):
            bodies[encoding] = Path(folder) / f"bomb.{encoding}"
            make_bomb(bodies[encoding], wbits)  # type: ignore[arg-type]
        # The gzip bomb gzipped again ("Content-Encoding: gzip, gzip"): a few kB that a decoder
        # which inflates a whole chunk at once turns into the whole 2 GiB in one call.
        nested = Path(folder) / "bomb.gzip-in-gzip"
        nested.write_bytes(gzip.compress(Path(folder, "bomb.gzip").read_bytes(), 9))
        bodies["gzip-in-gzip"] = nested
        print(f"code: {args.code}; {args.rows} rows, {args.in_flight} in flight; bombs inflate to {INFLATED >> 30} GiB")
        print("| answers | body | peak RSS | rows | wall |")
        print("| --- | --- | --- | --- | --- |")
        for answer in args.answers.split(","):
            body = bodies[answer]
            size = f"{body.stat().st_size / 1e3:,.0f} kB" if body else "small JSON"
            result = run(answer, body, args)
            assert str(Path(str(result["code"])).parent.parent) == str(Path(args.code).resolve()), result["code"]
            print(
                f"| {answer} | {size} | {result['peak_mib']:.0f} MiB | {result['statuses']} | {result['wall']:.1f} s |"
            )


if __name__ == "__main__":
    main()
