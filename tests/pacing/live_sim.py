"""The live lane on the virtual clock: a gateway's pacer (its requests live, ``Pacer(live=share)``)
beside batch runs' pacers on one key's budget, on this machine (a commit per start) or 20 ms away (a
Redis budget: starts reserved ahead, ``far_sim.Far``). The batch runs' requests all wait from the
start, as a job's rows do; each live request arrives when the test says. Every start reaches the
service at once (a strict judge: a count in any window), is answered after ``latency``, and what
every pacer took is kept: when each batch request of each run started, each live request's arrival
and start, what the budget's ledger counted. Used by ``test_live_lane.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from batchsum.errors import RateLimitError
from batchsum.local.state import SlidingWindow
from batchsum.pacing import Pacer
from batchsum.pacing.ahead import FarTurn
from batchsum.pacing.budgets.budget import ProcessBudget
from batchsum.pacing.pacer import _loop_time
from tests import virtual_clock
from tests.pacing.far_sim import Far
from tests.pacing.test_pacing import Sim, engine_hooks

RTT, JITTER = 0.02, 0.002  # a Redis a zone away: each call's round trip, and up to this more each way


@dataclass
class Lane:
    """What a simulation showed: each batch run's starts by request (its rows' order), each live
    request's (arrival, start), every start the pacers took, the 429s, what the budget's ledger
    counted (``told``: before the runs closed), the starts reserved ahead and never sent (``lost``),
    and the pacers themselves."""

    batch: list[list[float]] = field(default_factory=list)
    live: list[tuple[float, float]] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    refused: int = 0
    counted: int = 0
    told: int = 0  # counted while the runs were still open: every start told as it goes, not at the end
    lost: int = 0
    pacers: list[Pacer] = field(default_factory=list)

    def waits(self) -> list[float]:
        """Each live request's wait for its turn: its start less its arrival."""
        return [start - arrival for arrival, start in self.live]

    def batch_starts(self) -> list[float]:
        return sorted(t for run in self.batch for t in run)


async def _request(gate, sim: Sim, lane: Lane, latency: float) -> float:
    """One request through ``gate``: its start, retried until the service admits it."""
    while True:
        ticket = await gate.before_attempt()
        start = ticket[1]
        lane.starts.append(start)
        retry_after = sim.decide(start, False)
        await asyncio.sleep(latency)
        if retry_after is None:
            gate.after_attempt(ticket, None, None)
            return start
        lane.refused += 1
        gate.after_attempt(ticket, RateLimitError("Too Many Requests", status_code=429, retry_after=retry_after), None)


def simulate(
    rpm: float,
    *,
    runs: int = 1,
    each: int = 200,
    live_at: Sequence[float] = (),
    share: float = 0.25,
    far: bool = False,
    latency: float = 0.5,
    limit: tuple[int, float] | None = None,
    seed: int = 0,
    rtts: Sequence[float] = (),
) -> Lane:
    """``runs`` batch runs of ``each`` requests and a gateway whose live requests arrive at
    ``live_at`` (seconds), all at ``rpm`` on one key, the gateway's part ahead of the runs ``share``;
    ``far``: the budget 20 ms away (2 ms of jitter each way); ``limit``: the service's (a count in any
    window of so many seconds; default the plan's sixth in any 10 s); ``rtts``: each batch run's own round
    trip to a far budget (the gateway's: ``RTT``)."""
    inner = ProcessBudget(_loop_time, shared=True)
    rtt, jitter = (RTT, JITTER) if far else (0.0, 0.0)
    each_rtt = [*rtts, *[rtt] * (runs + 1 - len(rtts))]
    budgets = [Far(inner, each_rtt[n], jitter, seed + n, far=far) for n in range(runs + 1)]
    pacers = [Pacer(rpm, budget=budget) for budget in budgets[:runs]]
    gateway = Pacer(rpm, budget=budgets[runs], live=share)  # share 0: a gateway with no live lane
    sim = Sim(latency=lambda t: latency)
    sim.window = SlidingWindow(*(limit or (int(rpm // 6), 10.0)))
    lane = Lane(batch=[[0.0] * each for _ in range(runs)], pacers=[*pacers, gateway])

    async def batch_request(gate, run: int, n: int) -> None:
        lane.batch[run][n] = await _request(gate, sim, lane, latency)

    async def live_request(gate, at: float) -> None:
        await asyncio.sleep(at)
        arrived = asyncio.get_running_loop().time()
        lane.live.append((arrived, await _request(gate, sim, lane, latency)))

    async def main() -> None:
        gates = [engine_hooks(pacer) for pacer in pacers]
        live_gate = engine_hooks(gateway)
        sent = [batch_request(gate, run, n) for run, gate in enumerate(gates) for n in range(each)]
        await asyncio.gather(*sent, *(live_request(live_gate, at) for at in live_at))
        await asyncio.sleep(1.0)  # the calls under way answered, nothing more asked
        lane.told = sum((await inner.ledger(3600.0)).starts)
        for pacer in lane.pacers:
            await pacer.flush()
        lane.counted = sum((await inner.ledger(3600.0)).starts)

    virtual_clock.run(main())
    lane.starts.sort()
    lane.live.sort()
    lane.lost = sum(p._turn.lateness.lost for p in lane.pacers if isinstance(p._turn, FarTurn))
    return lane
