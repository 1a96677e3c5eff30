"""The pace against every window kind a service may count in, side by side in one run. Run by hand:

    python -m benchmarks.windows                         # 6 kinds x 3 clients, 1 s answers (~25 min)
    python -m benchmarks.windows --latencies 5           # the same at 5 s answers
    python -m benchmarks.windows --kinds clock-1s --latencies 1 --minutes 0.3

Each cell: a local service of its own, strict at exactly the plan (``--rpm``, default 600) in one
window kind (``batchsum.local.state.LIMIT_KINDS``: a sliding minute, a fixed minute opened by the first
request, a token bucket of the plan, minutes on the clock, and the minute's share in each clock-aligned
10 s or 1 s window), answering in ``latency`` seconds; ``rpm x minutes`` texts. Clients: batchsum
(``summarize_stream`` at the plan; its defaults), an ``AsyncLimiter(rpm, 60)`` + a semaphore of 100
(what most loops do), and a full token bucket of the plan (the openai-cookbook processor's way), both
retrying a 429 after its Retry-After. Figures: utilization (admitted a minute, first to last admitted,
from the second on, over the plan), 429s, and the most starts seen in any 1 s / 10 s / 60 s (the plan allows
ceil(rpm*w/60)). Cells run one at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time

from aiolimiter import AsyncLimiter

from batchsum.local import Faults, LocalService
from batchsum.local.state import LIMIT_KINDS
from benchmarks.rate import FullBucket, busiest, run_batchsum, run_plain, texts

CLIENTS = ("batchsum", "aiolimiter+semaphore", "full-bucket")
SEMAPHORE = 100


async def with_semaphore(service: LocalService, rows: list[str], rpm: float) -> None:
    limiter, slots = AsyncLimiter(rpm, 60), asyncio.Semaphore(SEMAPHORE)

    async def acquire() -> None:
        async with slots:
            await limiter.acquire()

    await run_plain(service, rows, acquire)


def cell(kind: str, latency: float, client: str, rpm: float, minutes: float) -> dict:
    rows = texts(int(rpm * minutes))
    faults = Faults(latency=latency * 0.8, latency_spread=latency * 0.4, seed=7)
    with LocalService(rpm=int(rpm), faults=faults, limit_kind=kind) as service:
        started = time.monotonic()
        if client == "batchsum":
            asyncio.run(run_batchsum(service, rows, rpm, None))
        elif client == "aiolimiter+semaphore":
            asyncio.run(with_semaphore(service, rows, rpm))
        else:
            asyncio.run(run_plain(service, rows, FullBucket(rpm).acquire))
        wall = time.monotonic() - started
        by_status = service.stats()["by_status"]
        arrivals = sorted(service.state.arrivals)
        admitted = sorted(service.state.admitted)
    # From the second admitted start: batchsum's first request goes alone (its answer's time is the
    # one thing the pace cannot use), the loops' do not.
    span = admitted[-1] - admitted[1] if len(admitted) > 2 else 0.0
    return {
        "kind": kind,
        "latency": latency,
        "client": client,
        "utilization": (len(admitted) - 2) / span * 60 / rpm if span else 0.0,
        "429s": by_status.get("429", 0),
        "most": [busiest(arrivals, w - 1e-9) for w in (1.0, 10.0, 60.0)],
        "allowed": [math.ceil(rpm * w / 60) for w in (1.0, 10.0, 60.0)],
        "wall": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rpm", type=float, default=600, help="the plan: the service's limit and the pace")
    parser.add_argument("--minutes", type=float, default=1.2, help="texts per cell, in minutes at the plan")
    parser.add_argument("--latencies", type=float, nargs="+", default=[1.0], help="mean answer times")
    parser.add_argument("--kinds", nargs="+", choices=list(LIMIT_KINDS), default=list(LIMIT_KINDS))
    parser.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    args = parser.parse_args()
    started = time.monotonic()
    print("| service counts | answers | client | utilization | 429s | most in 1 s / 10 s / 60 s (allowed) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind in args.kinds:
        for latency in args.latencies:
            for client in args.clients:
                r = cell(kind, latency, client, args.rpm, args.minutes)
                most = " / ".join(map(str, r["most"]))
                allowed = " / ".join(map(str, r["allowed"]))
                print(
                    f"| {kind} | {latency:g} s | {client} | {r['utilization']:.3f} | {r['429s']} | "
                    f"{most} ({allowed}) |",
                    flush=True,
                )
    print(f"\nwhole run: {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
