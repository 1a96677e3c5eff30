"""Runs under ``rpm="auto"`` on the virtual clock, several at once on one budget (as processes on one
machine share it, each with its own pacer and its own view of the key's record), one wave after
another in one loop, so the simulated service (``test_short_job.Service``) and the budget keep one
clock and judge them all as one key."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, TypeVar

import httpx

import batchsum
from batchsum.engine import summarize_stream
from batchsum.errors import BudgetError
from batchsum.pacing import KeyRecord, Pacer
from batchsum.pacing.auto.limit import Found
from batchsum.pacing.budgets.budget import Budget, ProcessBudget, Remembered, Share
from batchsum.run.spec import AUTO_MAX_RPM
from tests import virtual_clock
from tests.pacing.far_sim import Far
from tests.pacing.test_short_job import KEY, Service, uniform

MINUTE = 60.0
FAR = 0.02  # a Redis budget a zone away: each call's round trip ...
JITTER = 0.002  # ... and up to this more each way
T = TypeVar("T")


class Machine(ProcessBudget):
    """One budget shared by every simulated process (the machine's, or a Redis ``rtt`` seconds away
    from each), remembering what runs tell it."""

    def __init__(self, rtt: float = 0.0) -> None:
        super().__init__(lambda: asyncio.get_running_loop().time(), shared=True)
        self.rtt = rtt
        self.entries: dict[str, Remembered] = {}
        self.registry: dict[int, float | None] = {}  # the runs on the key now, each with its share

    def connect(self, seed: int = 0) -> Budget:
        """A process's way to this budget: itself on this machine, else a connection ``rtt`` away."""
        return self if not self.rtt else Connection(self, self.rtt, seed)

    async def runs(self) -> list[SimpleNamespace]:
        """The live runs on the key, each with its ``share`` (None: the whole key), as the budget's
        registry gives them (``Budget.runs``)."""
        return [SimpleNamespace(share=share) for share in self.registry.values()]

    async def recall(self, key_hash: str, service: str) -> list[Remembered]:
        return list(self.entries.values())

    async def remember(self, key_hash: str, service: str, entries: dict[str, str]) -> None:
        for name, value in entries.items():
            self.entries[name] = Remembered(key_hash, service, name, value, time.time())

    def limit(self) -> Found | None:
        entry = self.entries.get("limit")
        return None if entry is None else Found.from_json(entry.value, entry.at)


class Connection(Far):
    """One process's connection to the machine's budget, on this machine (``rtt`` 0) or a network
    away (``rtt`` seconds each call, with jitter: a Redis budget, whose pacers reserve ahead);
    ``dead``: the process was killed (it says nothing more to the budget, its lead least of all)."""

    def __init__(self, machine: Machine, rtt: float = 0.0, seed: int = 0) -> None:
        super().__init__(machine, rtt, JITTER if rtt else 0.0, seed, far=rtt > 0)
        self.machine = machine
        self.dead = False

    async def _way(self) -> None:
        if self.dead:
            raise BudgetError("this process is gone")
        await super()._way()


@dataclass
class Wave:
    """Runs started together: their rows, when each ended (virtual seconds), their pacers, and the
    service's arrivals and 429s during the wave."""

    rows: list[list[Any]] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    pacers: list[Pacer] = field(default_factory=list)
    began: float = 0.0
    arrivals: list[float] = field(default_factory=list)
    refused: int = 0

    @property
    def statuses(self) -> set[str]:
        return {r.status for rows in self.rows for r in rows}

    @property
    def seconds(self) -> float:
        return max(self.ends) - self.began

    def rate(self) -> float:
        """Starts a minute from the wave's first to its last arrival at the service."""
        a = self.arrivals
        return (len(a) - 1) / (a[-1] - a[0]) * MINUTE if len(a) > 1 else 0.0


def texts(n: int, run: int, seed: int = 0) -> list[str]:
    return [f"Run {run} seed {seed} text {i} has enough words in it to be worth a summary here." for i in range(n)]


async def wave(
    service: Service,
    machine: Machine,
    n: int,
    runs: int = 1,
    *,
    cap: float = AUTO_MAX_RPM,
    seed: int = 0,
    starts: tuple[float, ...] = (),
    budget: Callable[[int], Any] | None = None,
    share: Share | None | list[Share | None] = None,
    on_pacer: Callable[[Pacer], None] | None = None,
) -> Wave:
    """``runs`` runs of ``n`` texts each with ``rpm="auto"`` on ``machine``'s budget (or
    ``budget(i)``'s), started at the offsets ``starts`` (default: together); ``share`` each run's (or
    one per run); ``on_pacer`` told of each run's pacer as it starts. Each run is on the machine's
    registry of runs while it runs."""
    loop = asyncio.get_running_loop()
    out = Wave(began=loop.time())
    arrived, refused = len(service.arrivals), service.refused

    async def one(number: int) -> tuple[list[Any], float, Pacer]:
        delay = starts[number] if number < len(starts) else 0.0
        if delay:
            await asyncio.sleep(delay)
        on = machine.connect(number) if budget is None else budget(number)
        record = KeyRecord(on, "keyhash", "https://svc", await machine.recall("keyhash", "https://svc"))
        own = share[number] if isinstance(share, list) else share
        pacer = Pacer(cap, auto=True, record=record, budget=on, share=own)
        if on_pacer is not None:
            on_pacer(pacer)
        machine.registry[id(pacer)] = None if own is None else own.fraction
        try:
            async with batchsum.AsyncClient(KEY, "http://127.0.0.1:9", transport=httpx.MockTransport(service)) as c:
                stream = summarize_stream(texts(n, number, seed), c, rpm=cap, pacer=pacer, record=record)
                rows = [r async for r in stream]
        finally:
            del machine.registry[id(pacer)]
        return rows, loop.time(), pacer

    for rows, end, pacer in await asyncio.gather(*(one(i) for i in range(runs))):
        out.rows.append(rows)
        out.ends.append(end)
        out.pacers.append(pacer)
    out.arrivals = service.arrivals[arrived:]
    out.refused = service.refused - refused
    await asyncio.sleep(1.0)
    return out


def scenario(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``main()`` on one virtual clock."""
    return virtual_clock.run(main())


def service_with(limit: Any, latency: tuple[float, float] = (0.3, 0.7)) -> Service:
    service = Service("sliding", latency=uniform(*latency))
    service.limit = limit
    return service


async def told(service: Service, n: int, rpm: float) -> Wave:
    """One run of ``n`` texts told ``rpm`` (no search), on a budget of its own: what a run that knows
    the limit costs, beside one that finds it."""
    loop = asyncio.get_running_loop()
    out = Wave(began=loop.time())
    arrived, refused = len(service.arrivals), service.refused
    pacer = Pacer(rpm, budget=ProcessBudget(loop.time))
    async with batchsum.AsyncClient(KEY, "http://127.0.0.1:9", transport=httpx.MockTransport(service)) as c:
        out.rows.append([r async for r in summarize_stream(texts(n, 0, 9), c, rpm=rpm, pacer=pacer)])
    out.ends.append(loop.time())
    out.pacers.append(pacer)
    out.arrivals = service.arrivals[arrived:]
    out.refused = service.refused - refused
    return out
