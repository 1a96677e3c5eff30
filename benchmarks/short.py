"""The short job: a few hundred to a thousand rows, where the start and the pace's margins are most
of the wait. Side by side in one run, each client against its own local service. Run by hand:

    python benchmarks/short.py                      # everything (~8 min; --parallel: ~3 min)
    python benchmarks/short.py --rows 300 --kinds fixed stated

A silent service (no rate-limit headers, as the live one), 1200 texts at 600/min, answers in 4-6 s,
with each of three ways of counting the limit: (a) a fixed window of 60 s opened by the key's first
request (a Redis INCR + EXPIRE counter), (b) a token bucket of 600 that starts full, (c) a sliding
window of 60 s. Then a service that states its room (``RateLimit-Remaining``/``-Reset`` on a fixed
window): 300 texts at 600/min, answers in 0.4-0.6 s. Clients: batchsum (``summarize_texts``, its
defaults: the machine's budget, automatic in flight; a new key, so its first request goes alone),
batchsum with a proven key (``batchsum-proven``: the same key answered by the same service a
moment before, by a one-row run that is not timed, so no lone first request), an ``AsyncLimiter(rpm, 60)`` + semaphore loop
(100 in flight, retrying a 429 after its Retry-After), and a token bucket of 600 that starts full
(no cap in flight). The ideal beside them: rows / rpm + one mean answer (a silent service), or two
answers (a stating one: the first alone, then the rest at once).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from aiolimiter import AsyncLimiter

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rate import FullBucket, post_until_answered, texts  # noqa: E402  (the benchmark next door)

import batchsum  # noqa: E402
from batchsum.local import Faults, LocalService  # noqa: E402
from batchsum.run.report import BatchStats  # noqa: E402

CLIENTS = ("batchsum", "batchsum-proven", "aiolimiter+semaphore", "full-bucket")
KINDS = {  # name: (limit kind, headers, rows, latency from, latency to)
    "fixed": ("fixed", None, 1200, 4.0, 6.0),
    "bucket": ("bucket", None, 1200, 4.0, 6.0),
    "sliding": ("sliding", None, 1200, 4.0, 6.0),
    "stated": ("fixed", "ratelimit", 300, 0.4, 0.6),
}
SEMAPHORE = 100


async def run_plain(service: LocalService, rows: list[str], acquire, in_flight: int | None) -> None:
    headers = {"Authorization": f"Bearer {service.key}"}
    limits = httpx.Limits(max_connections=5000)
    slots = asyncio.Semaphore(in_flight) if in_flight else None

    async def one(http: httpx.AsyncClient, text: str) -> None:
        if slots is None:
            await post_until_answered(http, text, acquire)
            return
        async with slots:
            await post_until_answered(http, text, acquire)

    async with httpx.AsyncClient(base_url=service.url, headers=headers, timeout=120, limits=limits) as http:
        await asyncio.gather(*(one(http, t) for t in rows))


async def run_batchsum(service: LocalService, rows: list[str], rpm: float) -> BatchStats:
    stats = BatchStats()
    await batchsum.summarize_texts(
        rows, api_key=service.key, base_url=service.url, rpm=rpm, progress=False, max_retries=50, stats=stats
    )
    return stats


def busiest(times: list[float], window: float) -> int:
    times = sorted(times)
    return max((bisect.bisect_left(times, t + window) - i for i, t in enumerate(times)), default=0)


def one(client: str, kind: str, rpm: float, rows_n: int | None) -> dict:
    limit_kind, headers, n, low, high = KINDS[kind]
    n = rows_n or n
    rows = texts(n)
    faults = Faults(latency=low, latency_spread=high - low, seed=hash(client) % 1000)
    with LocalService(rpm=int(rpm), faults=faults, limit_kind=limit_kind, room_headers=headers) as service:
        started = time.monotonic()
        stats = None
        if client in ("batchsum", "batchsum-proven"):
            if client == "batchsum-proven":  # proven a moment before: the key's record in the budget
                asyncio.run(run_batchsum(service, ["A text that proves the key is answered by this service."], rpm))
                started = time.monotonic()
            stats = asyncio.run(run_batchsum(service, rows, rpm))
        elif client == "aiolimiter+semaphore":
            asyncio.run(run_plain(service, rows, AsyncLimiter(rpm, 60).acquire, SEMAPHORE))
        else:
            asyncio.run(run_plain(service, rows, FullBucket(rpm).acquire, None))
        wall = time.monotonic() - started
        by_status = service.stats()["by_status"]
        arrivals = sorted(service.state.arrivals)
    mean = (low + high) / 2
    ideal = n / rpm * 60 + mean if headers is None else 2 * mean
    first = arrivals[0] if arrivals else 0.0
    return {
        "client": client,
        "kind": kind,
        "rows": n,
        "ok": by_status.get("200", 0),
        "429s": by_status.get("429", 0),
        "wall": wall,
        "ideal": ideal,
        "even_pace": n / rpm * 60 + mean,
        "first_60s": bisect.bisect_left(arrivals, first + 60) if arrivals else 0,
        "busiest_60s": busiest(arrivals, 60.0),
        "pace_changes": [str(c) for c in stats.pacer.changes] if stats is not None and stats.pacer else [],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rpm", type=float, default=600)
    parser.add_argument("--rows", type=int, default=None, help="rows per run (default: 1200 silent, 300 stated)")
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS))
    parser.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    parser.add_argument("--parallel", action="store_true", help="every kind at once (else one kind at a time)")
    parser.add_argument("--one", nargs=2, metavar=("CLIENT", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.rpm, args.rows)))
        return

    def child(client: str, kind: str) -> dict:
        command = [sys.executable, __file__, "--rpm", str(args.rpm), "--one", client, kind]
        if args.rows:
            command += ["--rows", str(args.rows)]
        with tempfile.TemporaryDirectory() as cache:  # a machine budget of its own (no other run in its last minute)
            env = {**os.environ, "XDG_CACHE_HOME": cache}
            out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
        return json.loads(out.stdout)

    print(f"short job at {args.rpm:g}/min; {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M')}")
    print("| service | client | rows ok | wall | ideal | wall / ideal | 429s | first 60 s | busiest 60 s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    jobs = [(k, c) for k in args.kinds for c in args.clients]
    workers = len(jobs) if args.parallel else len(args.clients)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [(k, pool.submit(child, c, k)) for k, c in jobs]
        for _kind, future in futures:
            r = future.result()
            print(
                f"| {r['kind']} | {r['client']} | {r['ok']}/{r['rows']} | {r['wall']:.1f} s | {r['ideal']:.1f} s "
                f"(even pace {r['even_pace']:.1f} s) | {r['wall'] / r['ideal']:.3f} | {r['429s']} | "
                f"{r['first_60s']} | {r['busiest_60s']} |",
                flush=True,
            )
            if r["pace_changes"]:
                print(f"|  | pace changes: {'; '.join(r['pace_changes'])} |", flush=True)


if __name__ == "__main__":
    main()
