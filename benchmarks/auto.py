"""``--rpm auto`` by hand: what finding a limit costs, with every process on the key judged as one.

    python -m benchmarks.auto                      # all of them
    python -m benchmarks.auto --only four          # four CLI processes at once, then a fifth
    python -m benchmarks.auto --only lowered       # a limit found at 600, then the plan at 300
    python -m benchmarks.auto --only search        # the first search, side by side with --rpm told
    python -m benchmarks.auto --only redis --delay 20   # issue 52 item 0: the search on a Redis budget
    python -m benchmarks.auto --only halved        # issue 52 item 7: found at 400, then the plan halved
    python -m benchmarks.auto --only limiter --delay 20 # issue 52 item 4: a limiter on each budget

``four`` and ``lowered`` are real ``batchsum summarize`` processes (start-up included) against the
local service over loopback on one machine budget (a fresh cache folder), answers in 0.3-0.7 s:

- four: a strict sliding 240/min that states nothing; four processes of 300 distinct texts each
  started together with ``--rpm auto``; then ``batchsum limits``; then a fifth process of 300.
- lowered: run 1, 1500 texts on a sliding 600/min; then the service, at the same address with the
  same key, admits 300/min in fixed 10 s windows (50 per 10 s); 600 texts with ``--rpm auto``; the
  record; then 300 texts more.

- redis: a strict sliding 240/min that states nothing, on a ``redis://`` budget (its own redis-server,
  behind ``delay_proxy.py`` adding ``--delay`` ms to each round trip): one process of 300 texts with
  ``--rpm auto``; on a fresh key, two processes of 300 started together; then a third of 300. Each:
  the time against the ideal at 240/min, the longest silence at the service, 429s, the rate
  (``--budget machine``: the same on the machine's budget, to compare).
- halved: run 1, 500 texts on a sliding 400/min (``--rpm auto``, a search); the service replaced at
  the same address by a sliding 200/min; run 2 of 400 texts, run 3 of 200 (``--budget``: ``machine``,
  or ``redis`` with ``--delay``).
- limiter: 16 texts at rpm 240 with an ``aiolimiter.AsyncLimiter(1, 0.5)`` (Python: the limiter has
  no flag), on the machine's budget and on Redis ``--delay`` ms away: the time, and requests at the
  service.

``search`` runs on the virtual clock (``tests/pacing/auto_sim.py``: the real engine, client and pacer
against a simulated service, every window kind exact), since a real-time grid would take hours: the
first search at 60, 600 and 3000/min on a sliding minute, fixed 10 s windows and a token bucket
holding 2.5 s of the limit, each a job of ten minutes at the limit, beside the same job told the
right ``--rpm``: 429s, time, and the limit found.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from batchsum.local import Faults, LocalService
from benchmarks.rate import texts

BATCHSUM = str(Path(sys.executable).parent / "batchsum")


class Machine:
    """One machine's budget (a cache folder, or ``budget``: a ``redis://`` one) and the service the
    CLI processes use."""

    def __init__(self, service: LocalService, folder: Path, budget: str = "machine") -> None:
        self.service, self.folder = service, folder
        self.env = {
            **os.environ,
            "BATCHSUM_API_KEY": service.key,
            "BATCHSUM_BASE_URL": service.url,
            "XDG_CACHE_HOME": str(folder / "cache"),
            "BATCHSUM_BUDGET": budget,
        }

    def start(self, rows: list[str], name: str, rpm: str = "auto") -> tuple[subprocess.Popen[bytes], Path, Path]:
        source, out = self.folder / f"{name}.parquet", self.folder / f"{name}-out.parquet"
        pd.DataFrame({"text": rows}).to_parquet(source)
        report = self.folder / f"{name}.json"
        argv = [BATCHSUM, "summarize", str(source), "-o", str(out), "--column", "text", "--rpm", rpm]
        argv += ["--quiet", "--report", str(report)]
        return subprocess.Popen(argv, env=self.env), out, report

    def runs(self, batches: list[list[str]], name: str, rpm: str = "auto") -> dict[str, object]:
        """``batches`` as processes started together: rows ok, 429s at the service, the slowest's wall
        time, and what each report says of the limit."""
        before = self.service.stats()["by_status"].get("429", 0)
        since = len(self.service.state.arrivals)
        started = time.monotonic()
        procs = [self.start(rows, f"{name}-{i}", rpm) for i, rows in enumerate(batches)]
        ends = []
        for proc, _, _ in procs:
            proc.wait()
            ends.append(time.monotonic() - started)
        reports = [json.loads(report.read_text()) for _, _, report in procs]
        ok = sum(int((pd.read_parquet(out)["summary_status"] == "ok").sum()) for _, out, _ in procs)
        arrivals = list(self.service.state.arrivals)[since:]
        return {
            "rows": sum(len(rows) for rows in batches),
            "ok": ok,
            "429s": self.service.stats()["by_status"].get("429", 0) - before,
            "wall": round(max(ends), 1),
            "silence": round(max((b - a for a, b in zip(arrivals, arrivals[1:])), default=0.0), 1),
            "limits": sorted({f"{r['pace']['limit']} ({r['pace']['limit_source']})" for r in reports}),
            "exit": [proc.returncode for proc, _, _ in procs],
        }

    def limits(self) -> str:
        return subprocess.run([BATCHSUM, "limits"], env=self.env, capture_output=True, text=True).stdout.strip()


def rate_of(service: LocalService, since: int) -> float:
    """Starts a minute at the service from its ``since``-th arrival on."""
    arrivals = list(service.state.arrivals)[since:]
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]) * 60 if len(arrivals) > 1 else 0.0


def four() -> None:
    faults = Faults(latency=0.3, latency_spread=0.4, seed=3)
    with tempfile.TemporaryDirectory() as tmp, LocalService(rpm=240, faults=faults) as service:
        machine = Machine(service, Path(tmp))
        pool = texts(1500)
        together = machine.runs([pool[i * 300 : (i + 1) * 300] for i in range(4)], "together")
        ideal = 1200 / 240 * 60
        print(f"four together: {together} -> {together['wall'] / ideal:.3f}x of {ideal:.0f} s", flush=True)
        print(f"batchsum limits: {machine.limits()}", flush=True)
        since = len(service.state.arrivals)
        fifth = machine.runs([pool[1200:1500]], "fifth")
        print(f"fifth: {fifth} -> {rate_of(service, since) / 240:.3f} of 240/min at the service", flush=True)


def lowered() -> None:
    faults = Faults(latency=0.3, latency_spread=0.4, seed=3)
    pool = texts(2500)
    with tempfile.TemporaryDirectory() as tmp:
        with LocalService(rpm=600, faults=faults) as service:
            key, port = service.key, service.port
            machine = Machine(service, Path(tmp))
            first = machine.runs([pool[:1500]], "first")
            print(f"run 1 (sliding 600/min): {first}; {machine.limits()}", flush=True)
        with LocalService([key], rpm=300, limit_kind="clock-10s", faults=faults, port=port) as service:
            machine.service = service
            second = machine.runs([pool[1500:2100]], "second")
            print(f"run 2 (50 per 10 s): {second}; {machine.limits()}", flush=True)
            since = len(service.state.arrivals)
            third = machine.runs([pool[2100:2400]], "third")
            print(f"run 3: {third} -> {rate_of(service, since) / 300:.3f} of 300/min at the service", flush=True)


class Budget:
    """Where the runs' budget lives: ``machine``, or a redis-server of the benchmark's own behind a
    proxy ``delay`` ms away (``far_budget.Redis``), fresh for each call of ``open``."""

    def __init__(self, kind: str, delay_ms: float) -> None:
        self.kind, self.delay = kind, delay_ms / 1000

    @contextlib.contextmanager
    def open(self, folder: Path) -> Iterator[str]:
        if self.kind == "machine":
            yield "machine"
            return
        from benchmarks.far_budget import Redis

        redis = Redis(str(folder), self.delay)
        try:
            yield redis.url
        finally:
            redis.close()


def on_redis(budget: Budget) -> None:
    """Issue 52 item 0: the search on a Redis budget, one run, then two together and a third."""
    faults = Faults(latency=0.3, latency_spread=0.4, seed=3)
    pool = texts(1200)
    ideal = 300 / 240 * 60
    for label, batches in (("one run", [pool[:300]]), ("two together", [pool[300:600], pool[600:900]])):
        with tempfile.TemporaryDirectory() as tmp, budget.open(Path(tmp)) as where:
            with LocalService(rpm=240, faults=faults) as service:
                machine = Machine(service, Path(tmp), where)
                out = machine.runs(batches, label.replace(" ", "-"))
                wall = float(out["wall"])  # type: ignore[arg-type]
                print(
                    f"{label}: {out} -> {wall / (ideal * len(batches)):.3f}x of {ideal * len(batches):.0f} s",
                    flush=True,
                )
                if len(batches) == 2:
                    since = len(service.state.arrivals)
                    third = machine.runs([pool[900:1200]], "third")
                    print(
                        f"third: {third} -> {rate_of(service, since) / 240:.3f} of 240/min at the service", flush=True
                    )


def halved(budget: Budget) -> None:
    """Issue 52 item 7: a key found at 400/min on a sliding minute, then the plan halved."""
    faults = Faults(latency=0.3, latency_spread=0.4, seed=3)
    pool = texts(1100)
    with tempfile.TemporaryDirectory() as tmp, budget.open(Path(tmp)) as where:
        with LocalService(rpm=400, faults=faults) as service:
            key, port = service.key, service.port
            machine = Machine(service, Path(tmp), where)
            first = machine.runs([pool[:500]], "first")
            print(f"run 1 (sliding 400/min): {first}; {machine.limits()}", flush=True)
        with LocalService([key], rpm=200, faults=faults, port=port) as service:
            machine.service = service
            second = machine.runs([pool[500:900]], "second")
            print(f"run 2 (sliding 200/min): {second}; {machine.limits()}", flush=True)
            since = len(service.state.arrivals)
            third = machine.runs([pool[900:1100]], "third")
            print(f"run 3: {third} -> {rate_of(service, since) / 200:.3f} of 200/min at the service", flush=True)


def limiter(budget: Budget) -> None:
    """Issue 52 item 4: 16 texts at rpm 240 under a limiter of one a 0.5 s, on each budget."""
    import asyncio

    from aiolimiter import AsyncLimiter

    from batchsum.run import summarize_texts

    for kind in ("machine", budget.kind):
        with tempfile.TemporaryDirectory() as tmp, Budget(kind, budget.delay * 1000).open(Path(tmp)) as where:
            os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
            with LocalService(rpm=240) as service:
                started = time.monotonic()
                rows = asyncio.run(
                    summarize_texts(
                        texts(16),
                        api_key=service.key,
                        base_url=service.url,
                        rpm=240,
                        budget=where,
                        limiter=AsyncLimiter(1, 0.5),
                        progress=False,
                    )
                )
                wall = time.monotonic() - started
                sent = sum(service.stats()["by_status"].values())
            print(
                f"limiter on {kind}: {wall:.1f} s, {sum(r.status == 'ok' for r in rows)} ok, {sent} requests",
                flush=True,
            )


def judges(rpm: int) -> dict[str, object]:
    """The window kinds of the search, each strict at ``rpm`` a minute."""
    from batchsum.local.state import ClockWindow, SlidingWindow, TokenBucket

    return {
        "sliding minute": lambda: SlidingWindow(rpm, 60.0),
        "fixed 10 s windows": lambda: ClockWindow(rpm // 6, 10.0),
        "bucket of 2.5 s": lambda: TokenBucket(rpm // 24, rpm // 24 * 60 / rpm),
    }


def search_one(rpm: int, kind: str, make: object) -> str:
    """A job of ten minutes at ``rpm`` with ``--rpm auto`` on a fresh key, and told ``--rpm``."""
    import random

    from tests.pacing.auto_sim import Machine as Simulated
    from tests.pacing.auto_sim import scenario, service_with, told, wave

    random.seed(rpm)
    latency = (0.05, 0.2) if rpm >= 3000 else (0.3, 0.7)
    n = rpm * 10
    searching, knowing, machine = service_with(make(), latency), service_with(make(), latency), Simulated()  # type: ignore[operator]

    async def both():  # type: ignore[no-untyped-def]
        return await wave(searching, machine, n), await told(knowing, n, rpm)

    searched, known = scenario(both)
    found, ideal = machine.limit(), n / rpm * 60
    return (
        f"{rpm:>5}/min {kind:<19} told --rpm: {known.refused:>3} 429s {known.seconds / ideal:.3f}x"
        f" | auto: {searched.refused:>3} 429s {searched.seconds / ideal:.3f}x,"
        f" found {found.rpm if found else None} ({found.how if found else '-'})"
    )


def search(limits: list[int]) -> None:
    for rpm in limits:
        for kind, make in judges(rpm).items():
            print(search_one(rpm, kind, make), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--only", choices=["four", "lowered", "search", "redis", "halved", "limiter"], help="one part only"
    )
    parser.add_argument("--limits", default="60,600,3000", help="the plans of the search (a minute)")
    parser.add_argument(
        "--budget",
        choices=["machine", "redis"],
        default="redis",
        help="redis, halved: where the budget lives (redis: one of its own)",
    )
    parser.add_argument("--delay", type=float, default=0.0, help="ms added to each round trip to Redis")
    args = parser.parse_args()
    if args.only in (None, "redis"):
        on_redis(Budget(args.budget, args.delay))
    if args.only in (None, "halved"):
        halved(Budget(args.budget, args.delay))
    if args.only in (None, "limiter"):
        limiter(Budget("redis", args.delay))
    if args.only in (None, "four"):
        four()
    if args.only in (None, "lowered"):
        lowered()
    if args.only in (None, "search"):
        search([int(x) for x in args.limits.split(",")])


if __name__ == "__main__":
    main()
