"""One key, several processes: sharing one rate budget vs each pacing alone, side by side in one
run; and what one reservation costs. Run by hand:

    python benchmarks/budget.py --rpm 600 --rows 400 --processes 4     # about 3 minutes
    python benchmarks/budget.py --only cost

Sharing: `--processes` real processes, started together, each summarizing `--rows` texts of its own
with the same key against one local service that allows `rpm` per key in any sliding 60 s (429 with
Retry-After beyond that). Once through the machine budget (SQLite, the default), once through Redis
(a redis-server started here on a free port), once with `--budget none` (each process its own
pacer at `rpm`: what every per-process tool does). Each setting gets its own service and key, and
the three run at the same time. Utilization: requests the service admitted per minute, first to
last admitted arrival, over rpm.

Cost: microseconds per reservation, in one process, sequentially (the budget's own cost, not a wait).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from batchsum.local import LocalService
from batchsum.pacing.budgets.budget import ProcessBudget, RedisBudget, Report, SQLiteBudget

ROOT = Path(__file__).resolve().parent.parent

WORKER = textwrap.dedent("""
    import sys
    from batchsum.run import summarize_texts
    import asyncio
    n, rows, rpm, budget = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    texts = [f"Process {n} row {i}: " + " ".join(["alpha beta gamma delta epsilon zeta"] * 4) + "." for i in range(rows)]
    asyncio.run(summarize_texts(texts, rpm=rpm, budget=budget, progress=False, max_retries=50))
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(folder: str) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("needs redis-server: apt-get install redis-server")
    port = free_port()
    process = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", folder], stdout=subprocess.DEVNULL
    )
    import redis

    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(200):
        try:
            redis.Redis.from_url(url).ping()
            return process, url
        except redis.ConnectionError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def busiest(times: list[float], window: float) -> int:
    times = sorted(times)
    return max((bisect.bisect_right(times, t + window) - i for i, t in enumerate(times)), default=0)


def sharing(args: argparse.Namespace, redis_url: str, cache: str) -> None:
    settings = {"machine (SQLite, default)": "machine", "redis": redis_url, "none (each alone)": "none"}
    services = {name: LocalService([f"bs-bench-{i}"], rpm=int(args.rpm)).start() for i, name in enumerate(settings)}
    started = time.monotonic()
    runs = {}
    for name, spec in settings.items():
        service = services[name]
        env = {**os.environ, "BATCHSUM_API_KEY": service.key, "BATCHSUM_BASE_URL": service.url, "XDG_CACHE_HOME": cache}
        runs[name] = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(n), str(args.rows), str(args.rpm), spec], env=env, cwd=ROOT
            )
            for n in range(args.processes)
        ]
    walls = {}
    for name, processes in runs.items():
        for process in processes:
            process.wait()
        walls[name] = time.monotonic() - started
    alone = (args.rows * args.processes - 1) * 60 / args.rpm
    print(
        f"\n{args.processes} processes x {args.rows} rows, one key, limit {args.rpm:g}/min "
        f"(all rows at exactly the limit: {alone:.0f} s)\n"
    )
    print("| budget | utilization | 429s | busiest 60 s | busiest 10 s | wall |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, service in services.items():
        admitted = sorted(service.state.admitted)
        stats = service.state.stats()
        span = admitted[-1] - admitted[0]
        utilization = (len(admitted) - 1) / span * 60 / args.rpm if span else 0.0
        print(
            f"| {name} | {utilization:.3f} | {stats['by_status'].get('429', 0)} | {busiest(admitted, 60)} | "
            f"{busiest(admitted, 10)} | {walls[name]:.0f} s |"
        )
        service.stop()


async def cost(budget, count: int) -> float:
    await budget.reserve(0.0, start=False)
    started = time.perf_counter()
    for _ in range(count):
        await budget.reserve(0.0, Report())
    elapsed = time.perf_counter() - started
    await budget.aclose()
    return elapsed / count * 1e6


def costs(redis_url: str, folder: str, count: int) -> None:
    print(f"\nOne reservation, {count} in a row in one process (µs each):\n")
    print("| budget | µs per reservation |")
    print("| --- | --- |")
    for name, budget in [
        ("this process (ProcessBudget)", ProcessBudget(shared=True)),
        ("this machine (SQLite, WAL)", SQLiteBudget(Path(folder) / "cost.sqlite", "cost")),
        ("Redis on loopback (Lua script)", RedisBudget(redis_url, "cost")),
    ]:
        print(f"| {name} | {asyncio.run(cost(budget, count)):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rpm", type=float, default=600)
    parser.add_argument("--rows", type=int, default=400, help="rows per process")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--count", type=int, default=5000, help="reservations timed per budget")
    parser.add_argument("--only", choices=["sharing", "cost"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        redis_process, redis_url = start_redis(folder)
        try:
            if args.only in (None, "cost"):
                costs(redis_url, folder, args.count)
            if args.only in (None, "sharing"):
                sharing(args, redis_url, str(Path(folder) / "cache"))
        finally:
            redis_process.terminate()
            redis_process.wait()
    print(json.dumps({"date": time.strftime("%Y-%m-%d")}))


if __name__ == "__main__":
    main()
