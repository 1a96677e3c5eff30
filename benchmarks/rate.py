"""Rate utilization and 429s against a strict sliding-window limit, side by side in one run; recovery
after a storm; settling under a limit lower than --rpm; and the engine's overhead. Run by hand:

    python benchmarks/rate.py --rpm 600 --minutes 2          # everything (~12 min)
    python benchmarks/rate.py --only pacing --latencies 0.05 5

Pacing: each client sends to its own local service that allows `rpm` per key in any sliding 60 s
(429 with Retry-After beyond that) and answers after `latency` seconds. Utilization is the start rate
the service admitted (first to last admitted arrival) over rpm. Clients: batchsum with no concurrency
given (in flight sized automatically), batchsum with a fixed concurrency of 16, a plain
`AsyncLimiter(rpm, 60)` loop, and a token bucket that starts full (what most tools do).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from aiolimiter import AsyncLimiter

import batchsum
from batchsum.engine import summarize_stream
from batchsum.local import Faults, LocalService
from batchsum.run.report import BatchStats

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
CLIENTS = ("batchsum", "batchsum-c16", "aiolimiter", "full-bucket")


def texts(n: int, words: int = 20) -> list[str]:
    return [" ".join(f"w{i}" if j == 0 else WORDS[(i + j) % len(WORDS)] for j in range(words)) + "." for i in range(n)]


def busiest(times: list[float], window: float) -> int:
    times = sorted(times)
    return max((bisect.bisect_right(times, t + window) - i for i, t in enumerate(times)), default=0)


async def run_batchsum(service: LocalService, rows: list[str], rpm: float, concurrency: int | None) -> BatchStats:
    stats = BatchStats()
    async with batchsum.AsyncClient(service.key, service.url, max_retries=50, timeout=120) as client:
        async for _ in summarize_stream(rows, client, rpm=rpm, concurrency=concurrency, stats=stats):
            pass
    return stats


async def post_until_answered(http: httpx.AsyncClient, text: str, acquire) -> None:
    while True:
        await acquire()
        try:
            response = await http.post("/api/user/summarize", json={"text": text, "mode": 1})
        except httpx.HTTPError:
            continue  # what a plain loop does with a dropped or timed-out request: try again
        if response.status_code != 429:
            return
        await asyncio.sleep(float(response.headers.get("retry-after", 1)))


class FullBucket:
    """A token bucket of `rpm` tokens that starts full and refills at rpm/60 per second."""

    def __init__(self, rpm: float) -> None:
        self.capacity = self.tokens = rpm
        self.rate = rpm / 60
        self.last = time.monotonic()
        self.lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self.lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
                self.last = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                await asyncio.sleep((1 - self.tokens) / self.rate)


async def run_plain(service: LocalService, rows: list[str], acquire) -> None:
    headers = {"Authorization": f"Bearer {service.key}"}
    limits = httpx.Limits(max_connections=5000)
    async with httpx.AsyncClient(base_url=service.url, headers=headers, timeout=120, limits=limits) as http:
        await asyncio.gather(*(post_until_answered(http, t, acquire) for t in rows))


async def capped(work: Any, seconds: float) -> None:
    """Stop a client that cannot finish in time (a fixed concurrency at a long latency): its rate so far counts."""
    try:
        await asyncio.wait_for(work, seconds)
    except asyncio.TimeoutError:
        pass


def pacing_one(client: str, rpm: float, minutes: float, latency: float) -> dict:
    n = int(rpm * minutes)
    rows = texts(n)
    cap = minutes * 60 + latency + 60
    with LocalService(rpm=int(rpm), faults=Faults(latency=latency)) as service:
        started = time.monotonic()
        if client == "batchsum":
            asyncio.run(capped(run_batchsum(service, rows, rpm, None), cap))
        elif client == "batchsum-c16":
            asyncio.run(capped(run_batchsum(service, rows, rpm, 16), cap))
        elif client == "aiolimiter":
            limiter = AsyncLimiter(rpm, 60)
            asyncio.run(capped(run_plain(service, rows, limiter.acquire), cap))
        else:
            asyncio.run(capped(run_plain(service, rows, FullBucket(rpm).acquire), cap))
        elapsed = time.monotonic() - started
        stats = service.stats()
        admitted = sorted(service.state.admitted)
    span = admitted[-1] - admitted[0] if len(admitted) > 1 else 0
    rate = (len(admitted) - 1) / span * 60 if span else 0.0
    # batchsum sends its first request alone (a wrong key costs one request): from the second on.
    later = admitted[-1] - admitted[1] if len(admitted) > 2 else 0
    steady = (len(admitted) - 2) / later * 60 if later else 0.0
    return {
        "client": client,
        "latency": latency,
        "answered": stats["by_status"].get("200", 0),
        "utilization": rate / rpm,
        "after_first": steady / rpm,
        "429s": stats["by_status"].get("429", 0),
        "busiest_60s": busiest(admitted, 60.0),
        "wall": elapsed,
    }


def storm_recovery(rpm: float) -> dict:
    """batchsum at `rpm`, latency 0.5 s; from 70 s to 100 s every request is answered 429 (Retry-After 1)."""
    rows = texts(int(rpm * 3.2))
    with LocalService(rpm=int(rpm), faults=Faults(latency=0.5)) as service:
        t0 = time.monotonic()

        async def storm() -> None:
            await asyncio.sleep(70)
            service.faults = Faults(latency=0.5, rates={"429": 1.0}, retry_after=1.0)
            await asyncio.sleep(30)
            service.faults = Faults(latency=0.5)

        async def main() -> BatchStats:
            task = asyncio.ensure_future(storm())
            stats = await run_batchsum(service, rows, rpm, None)
            await task
            return stats

        stats = asyncio.run(main())
        admitted = sorted(t - t0 for t in service.state.admitted)
    end = 100.0
    recovered = next(
        (
            t - end
            for t in admitted
            if t >= end and bisect.bisect_left(admitted, t + 30) - bisect.bisect_left(admitted, t) >= 0.95 * rpm / 2
        ),
        None,
    )
    return {
        "storm_429s": stats.rate_limited,
        "recovered_after_s": recovered,
        "final_pace": stats.pace,
        "pace_changes": [str(c) for c in stats.pacer.changes] if stats.pacer else [],
    }


def settle(rpm: float, minutes: float) -> dict:
    """batchsum told `rpm`, against a service whose real limit is rpm/2."""
    real = int(rpm / 2)
    rows = texts(int(real * minutes))
    with LocalService(rpm=real, faults=Faults(latency=0.05)) as service:
        t0 = time.monotonic()
        stats = asyncio.run(run_batchsum(service, rows, rpm, None))
        admitted = sorted(t - t0 for t in service.state.admitted)
        by_status = service.stats()["by_status"]
    last = admitted[-1]
    late = [t for t in admitted if t >= last - 120]
    rate = (len(late) - 1) / (late[-1] - late[0]) * 60 if len(late) > 1 else 0
    return {
        "real_limit": real,
        "final_pace": stats.pace,
        "admitted_per_min_last_2min": rate,
        "within": abs(rate - real) / real,
        "429s": by_status.get("429", 0),
        "pace_changes": [str(c) for c in stats.pacer.changes] if stats.pacer else [],
    }


async def run_bare(url: str, key: str, rows: list[str], concurrency: int) -> None:
    slots = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as http:

        async def one(text: str) -> None:
            async with slots:
                (await http.post("/api/user/summarize", json={"text": text, "mode": 1})).json()["result"]

        await asyncio.gather(*(one(t) for t in rows))


def overhead(rows_n: int) -> dict:
    rows = texts(rows_n, 40)
    with LocalService() as service:
        asyncio.run(run_bare(service.url, service.key, rows[:200], 16))  # warm up
        timings: dict[str, list[float]] = {"bare": [], "batchsum": []}
        for name in ("bare", "batchsum", "bare", "batchsum"):
            started = time.perf_counter()
            if name == "batchsum":
                asyncio.run(run_batchsum(service, rows, 0, 16))
            else:
                asyncio.run(run_bare(service.url, service.key, rows, 16))
            timings[name].append(time.perf_counter() - started)
    bare, engine = min(timings["bare"]), min(timings["batchsum"])
    return {"bare_ms": bare / rows_n * 1e3, "batchsum_ms": engine / rows_n * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rpm", type=float, default=600, help="the limit and the configured pace")
    parser.add_argument("--minutes", type=float, default=2.0, help="requests per pacing run, in minutes at rpm")
    parser.add_argument("--latencies", type=float, nargs="+", default=[0.05, 1.0, 5.0, 20.0])
    parser.add_argument("--only", choices=["pacing", "storm", "settle", "overhead"], default=None)
    parser.add_argument("--one", nargs=2, metavar=("CLIENT", "LATENCY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(pacing_one(args.one[0], args.rpm, args.minutes, float(args.one[1]))))
        return

    def child(client: str, latency: float) -> dict:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--rpm",
                str(args.rpm),
                "--minutes",
                str(args.minutes),
                "--one",
                client,
                str(latency),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(out.stdout)

    # One latency at a time (the four clients side by side), beside the storm and the settling runs.
    with ThreadPoolExecutor(max_workers=2) as side, ThreadPoolExecutor(max_workers=len(CLIENTS)) as pool:
        storm = side.submit(storm_recovery, args.rpm) if args.only in (None, "storm") else None
        settled = side.submit(settle, args.rpm, 5.0) if args.only in (None, "settle") else None
        if args.only in (None, "pacing"):
            print(f"pacing: {int(args.rpm * args.minutes)} requests per run, limit {args.rpm:g} per sliding minute")
            print("| latency | client | utilization | after the first answer | 429s | busiest 60 s | wall |")
            print("| --- | --- | --- | --- | --- | --- | --- |", flush=True)
            for latency in args.latencies:
                for job in [pool.submit(child, c, latency) for c in CLIENTS]:
                    r = job.result()
                    print(
                        f"| {r['latency']:g} s | {r['client']} | {r['utilization']:.3f} | {r['after_first']:.3f} | {r['429s']} | "
                        f"{r['busiest_60s']} | {r['wall']:.0f} s |",
                        flush=True,
                    )
        if storm is not None:
            print("storm:", json.dumps(storm.result()), flush=True)
        if settled is not None:
            print("settle:", json.dumps(settled.result()), flush=True)
    if args.only in (None, "overhead"):
        print("overhead:", json.dumps(overhead(3000)))


if __name__ == "__main__":
    main()
