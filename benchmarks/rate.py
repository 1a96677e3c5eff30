"""Rate utilization and 429s against a sliding-window limit, batchsum vs a plain aiolimiter loop;
and the engine's overhead against a bare httpx loop. Run by hand:

    python benchmarks/rate.py --rpm 600 --minutes 1.5

Each pacing run sends rpm*minutes requests to a local service that allows `rpm` per key in any
sliding 60 seconds (answering 429 with Retry-After beyond that), and reports the rate the service
saw (requests it admitted per minute, first to last arrival) over rpm, and the 429 count.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import time

import httpx
from aiolimiter import AsyncLimiter

import batchsum
from batchsum.engine import BatchStats, summarize_stream
from batchsum.local import LocalService

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def texts(n: int, words: int = 40) -> list[str]:
    return [" ".join(f"w{i}" if j == 0 else WORDS[(i + j) % len(WORDS)] for j in range(words)) + "." for i in range(n)]


def busiest(times: list[float], window: float) -> int:
    """The most requests that arrived within any `window` seconds."""
    times.sort()
    return max((bisect.bisect_right(times, t + window) - i for i, t in enumerate(times)), default=0)


async def run_batchsum(service: LocalService, rows: list[str], rpm: float, concurrency: int) -> BatchStats:
    stats = BatchStats()
    async with batchsum.AsyncClient(service.key, service.url, max_retries=10) as client:
        async for _ in summarize_stream(rows, client, rpm=rpm, concurrency=concurrency, stats=stats):
            pass
    return stats


async def run_aiolimiter(service: LocalService, rows: list[str], rpm: float, concurrency: int) -> None:
    """The usual recipe: AsyncLimiter(rpm, 60) around each request, retry a 429 after Retry-After."""
    limiter = AsyncLimiter(rpm, 60)
    slots = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {service.key}"}
    async with httpx.AsyncClient(base_url=service.url, headers=headers, timeout=60) as http:
        async def one(text: str) -> None:
            async with slots:
                while True:
                    async with limiter:
                        response = await http.post("/api/user/summarize", json={"text": text, "mode": 1})
                    if response.status_code != 429:
                        return
                    await asyncio.sleep(float(response.headers.get("retry-after", 1)))

        await asyncio.gather(*(one(t) for t in rows))


async def run_bare(url: str, key: str, rows: list[str], concurrency: int) -> None:
    slots = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as http:
        async def one(text: str) -> None:
            async with slots:
                (await http.post("/api/user/summarize", json={"text": text, "mode": 1})).json()["result"]

        await asyncio.gather(*(one(t) for t in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rpm", type=float, default=600, help="the limit and the configured pace")
    parser.add_argument("--minutes", type=float, default=1.5, help="how long each pacing run lasts")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--overhead-rows", type=int, default=3000, help="requests in the overhead runs")
    args = parser.parse_args()
    n = int(args.rpm * args.minutes)
    print(f"pacing: {n} requests, limit {args.rpm:g} per sliding minute, concurrency {args.concurrency}")
    for name in ("batchsum", "aiolimiter"):
        with LocalService(rpm=int(args.rpm)) as service:
            started = time.monotonic()
            rows = texts(n, 20)
            if name == "batchsum":
                asyncio.run(run_batchsum(service, rows, args.rpm, args.concurrency))
            else:
                asyncio.run(run_aiolimiter(service, rows, args.rpm, args.concurrency))
            elapsed = time.monotonic() - started
            stats = service.stats()
            ok = stats["by_status"].get("200", 0)
            achieved = ok / elapsed * 60
            print(f"  {name:10s} {ok} answered in {elapsed:5.1f}s: {achieved:6.1f}/min = {achieved / args.rpm:.3f} "
                  f"of the limit; 429s: {stats['by_status'].get('429', 0)}; requests sent in the busiest 60 s: "
                  f"{busiest(list(service.state.arrivals), 60.0)}")

    print(f"overhead: {args.overhead_rows} requests, no limit, concurrency {args.concurrency}")
    rows = texts(args.overhead_rows, 40)
    with LocalService() as service:
        asyncio.run(run_bare(service.url, service.key, rows[:200], args.concurrency))  # warm up
        timings = {}
        for name in ("bare httpx", "batchsum", "bare httpx ", "batchsum "):
            started = time.perf_counter()
            if name.strip() == "batchsum":
                asyncio.run(run_batchsum(service, rows, 0, args.concurrency))
            else:
                asyncio.run(run_bare(service.url, service.key, rows, args.concurrency))
            timings.setdefault(name.strip(), []).append(time.perf_counter() - started)
        bare, engine = min(timings["bare httpx"]), min(timings["batchsum"])
        print(f"  bare httpx {bare:.2f}s ({bare / len(rows) * 1e3:.2f} ms/request), batchsum {engine:.2f}s "
              f"({engine / len(rows) * 1e3:.2f} ms/request): overhead {(engine - bare) / len(rows) * 1e3:+.2f} ms/request")


if __name__ == "__main__":
    main()
