"""Runs sharing one key's budget on the virtual clock, the budget a network away (``Far``: every call
takes a round trip, with jitter each way) and each start's request reaching the service after a send
delay: what the pace promises at the budget and at the service, and what it costs in calls. Used by
``test_budget.py`` and ``benchmarks/far_budget.py --simulate`` (64 workers at 60,000 a minute)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from batchsum.errors import RateLimitError
from batchsum.local.state import SlidingWindow
from batchsum.pacing import Pacer
from batchsum.pacing.ahead import FarTurn
from batchsum.pacing.budgets.budget import Budget, ProcessBudget, Remembered, Report, Share, Slot
from batchsum.pacing.budgets.exchange import Lead
from batchsum.pacing.budgets.ledger import LEDGER_SECONDS, Ledger
from batchsum.pacing.pacer import _loop_time
from tests import virtual_clock
from tests.pacing.test_pacing import Sim, engine_hooks

T = TypeVar("T")


class Far(Budget):
    """One process's connection to a budget ``rtt`` seconds away (each way half of it, plus up to
    ``jitter`` at random): the step itself runs on ``inner`` halfway, as Redis runs a script; so do
    its ledger, the lead of the key's search, the key's record and registry (``rtt`` 0 and ``far``
    False: a budget on this machine, called directly)."""

    def __init__(self, inner: ProcessBudget, rtt: float, jitter: float = 0.0, seed: int = 0, far: bool = True) -> None:
        self.inner, self.rtt, self.jitter = inner, rtt, jitter
        self.far = far
        self.shared = True
        self.random = random.Random(seed)
        self.calls: Counter[int] = Counter()
        self.epoch = inner.epoch

    async def _way(self) -> None:
        if self.rtt or self.jitter:
            await asyncio.sleep(self.rtt / 2 + self.random.uniform(0.0, self.jitter))

    async def _call(
        self,
        what: int,
        interval: float,
        report: Report,
        share: Share | None,
        count: int = 1,
        lead: float = 0.0,
        live: float = 0.0,
    ) -> Slot:
        self.calls[what] += 1
        await self._way()
        slot = await self.inner._call(what, interval, report, share, count, lead, live)
        self.epoch = slot.epoch
        await self._way()
        return slot

    async def _through(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` run on the budget, a round trip away."""
        await self._way()
        found = await call()
        await self._way()
        return found

    async def ledger(self, seconds: float = LEDGER_SECONDS) -> Ledger:
        return await self._through(lambda: self.inner.ledger(seconds))

    async def lead(self, holder: str, state: str | None = None, *, release: bool = False) -> Lead:
        return await self._through(lambda: self.inner.lead(holder, state, release=release))

    async def recall(self, key_hash: str, service: str) -> list[Remembered]:
        return await self._through(lambda: self.inner.recall(key_hash, service))

    async def remember(self, key_hash: str, service: str, entries: dict[str, str]) -> None:
        await self._through(lambda: self.inner.remember(key_hash, service, entries))

    async def runs(self) -> list[Any]:
        return await self._through(lambda: self.inner.runs())


def woken_late(pacer: Pacer, rng: random.Random, lag: Callable[[random.Random], float]) -> None:
    """``pacer``'s process woken late for each start, ``lag(rng)`` seconds after its time (a loaded
    machine's scheduling), as its far schedule waits for it (``FarTurn._sleep_until``)."""

    class Late(FarTurn):
        __slots__ = ()

        async def _sleep_until(self, at: float) -> None:
            await FarTurn._sleep_until(self, at)
            await asyncio.sleep(lag(rng))

    assert type(pacer._turn) is FarTurn
    pacer._turn.__class__ = Late


@dataclass
class Outcome:
    """What a simulation showed: the pacers' starts (when each went, on the virtual clock), their
    arrivals at the service, the 429s, the budget's calls, and the wall time the simulation took."""

    starts: list[float] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    refused: int = 0
    calls: int = 0
    lost: int = 0
    seconds: float = 0.0

    def span(self) -> float:
        return max(self.arrivals) - min(self.arrivals) if self.arrivals else 0.0


async def _send(gate, sim: Sim, outcome: Outcome, delay: Callable[[], float]) -> None:
    """One request through ``gate``: it reaches the service ``delay()`` after its start (the machine
    holding the process, the client, the network); retried until answered."""
    first = True
    while True:
        ticket = await gate.before_attempt()
        outcome.starts.append(ticket[1])
        wait = delay()
        if wait > 0:
            await asyncio.sleep(wait)
        arrival = asyncio.get_running_loop().time()
        outcome.arrivals.append(arrival)
        retry_after = sim.decide(arrival, first)
        first = False
        await asyncio.sleep(sim.latency(arrival))
        if retry_after is None:
            gate.after_attempt(ticket, None, None)
            return
        outcome.refused += 1
        gate.after_attempt(ticket, RateLimitError("Too Many Requests", status_code=429, retry_after=retry_after), None)


def simulate(
    runs: int,
    each: int,
    rpm: float,
    *,
    rtt: float = 0.02,
    jitter: float = 0.002,
    far: bool = True,
    limit: tuple[int, float] | None = None,
    latency: float = 0.3,
    delay: Callable[[random.Random], float] = lambda rng: 0.0,
    lag: Callable[[random.Random], float] | None = None,
    seed: int = 0,
) -> Outcome:
    """``runs`` processes, ``each`` requests each, at ``rpm`` on one key, through one budget ``rtt``
    away (``far``: as a Redis budget is used; else as a local one, with a commit per start); the
    service admits ``limit`` (a count in any window of so many seconds; None: everything) and answers
    after ``latency``;
    ``delay(rng)``: each start's send delay; ``lag(rng)``: how late a process wakes for each start
    (a loaded machine's scheduling, ``woken_late``)."""
    inner = ProcessBudget(_loop_time, shared=True)
    budgets = [Far(inner, rtt, jitter, seed + n, far=far) for n in range(runs)]
    rng = random.Random(seed)
    pacers = [Pacer(rpm, budget=budget) for budget in budgets]
    for pacer in pacers if lag is not None and far else ():
        woken_late(pacer, rng, lag)
    sim = Sim(latency=lambda t: latency)
    if limit is not None:
        sim.window = SlidingWindow(*limit)
    outcome = Outcome()
    began = time.perf_counter()

    async def main() -> None:
        gates = [engine_hooks(pacer) for pacer in pacers]
        await asyncio.gather(*(_send(gate, sim, outcome, lambda: delay(rng)) for gate in gates for _ in range(each)))
        for pacer in pacers:
            await pacer.flush()

    virtual_clock.run(main())
    outcome.seconds = time.perf_counter() - began
    outcome.calls = sum(sum(budget.calls.values()) for budget in budgets)
    outcome.lost = sum(pacer._turn.lateness.lost for pacer in pacers if isinstance(pacer._turn, FarTurn))
    return outcome
