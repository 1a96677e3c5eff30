"""The short job (issue 24) on virtual time: the engine, the client and the pacer end to end against
a simulated service (an ``httpx.MockTransport`` whose answers take virtual seconds), so a run of
minutes takes a second and every count is exact. No real server can run on a virtual clock; the
same service kinds over loopback are in ``test_local_limits.py``.

- A silent service: the lone first request leaves the first minute's slots unused, and the rest of
  that minute spends them (the catch-up). A per-minute window that opens at the first request and a
  token bucket that starts full admit it all: no 429. A sliding window refuses some near the end of
  the first minute: no row fails, and the pace is the plan's afterwards.
- A stating service (``RateLimit-Remaining``/``-Reset``): its room is used at once, never past it.
- A bad key costs exactly one request either way."""

from __future__ import annotations

import asyncio
import bisect
import math
import random

import httpx
import pytest

import batchsum
from batchsum import contract
from batchsum.budget import ProcessBudget, Report, Share
from batchsum.contract import Messages
from batchsum.engine import summarize_stream
from batchsum.local.state import LIMIT_KINDS, TokenBucket
from batchsum.pacing import JITTER_MARGIN, Pacer
from batchsum.report import BatchStats
from tests import virtual_clock

KEY = "test-key-short-job-0123456789"
RPM = 600


class Service:
    """A per-key limit of ``kind`` (``batchsum.local.state``: sliding, fixed, bucket), decided at
    arrival; answers after ``latency()``; ``state_room``: every answer states the room left."""

    def __init__(self, kind: str, *, latency, rpm: int = RPM, state_room: str | None = None, key: str = KEY):
        self.limit = LIMIT_KINDS[kind](rpm)
        self.latency = latency
        self.rpm = rpm
        self.state_room = state_room
        self.key = key
        self.arrivals: list[float] = []
        self.admitted: list[float] = []
        self.refused = 0
        self.on_wire = self.most_on_wire = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        now = asyncio.get_running_loop().time()
        self.arrivals.append(now)
        if request.headers.get("authorization") != f"Bearer {self.key}":
            await asyncio.sleep(self.latency())
            return httpx.Response(
                401, json={"type": contract.ERROR_TYPE_INVALID_REQUEST, "message": Messages.INVALID_KEY}
            )
        wait = self.limit.admit(now)
        headers = self.room_headers(now)
        self.on_wire += 1
        self.most_on_wire = max(self.most_on_wire, self.on_wire)
        try:
            await asyncio.sleep(self.latency())
        finally:
            self.on_wire -= 1
        if wait is not None:
            self.refused += 1
            retry_after = {"Retry-After": str(max(1, math.ceil(wait)))}
            return httpx.Response(429, json={"error": Messages.RATE_LIMITED}, headers={**retry_after, **headers})
        self.admitted.append(now)
        return httpx.Response(200, json={contract.FIELD_RESULT: "A summary."}, headers=headers)

    def room_headers(self, now: float) -> dict[str, str]:
        """The room left, in whole seconds rounded up, in the style ``state_room`` names."""
        if self.state_room is None:
            return {}
        remaining, reset = self.limit.room(now)
        seconds = max(1, math.ceil(reset - 1e-6))
        if self.state_room == "RateLimit":  # the IETF draft's one field
            return {"RateLimit": f"limit={self.rpm}, remaining={remaining}, reset={seconds}"}
        prefix = self.state_room  # "RateLimit-" or "X-RateLimit-"
        return {f"{prefix}Limit": str(self.rpm), f"{prefix}Remaining": str(remaining), f"{prefix}Reset": str(seconds)}


def texts(n: int) -> list[str]:
    return [f"Text number {i} has enough words in it to be worth a summary of its own." for i in range(n)]


def run(service: Service, n: int, *, key: str = KEY, rpm: float = RPM, **pacer_options):
    """``n`` texts through ``summarize_stream`` at ``rpm``; (results, stats, virtual seconds, pacer)."""

    async def main():
        stats = BatchStats()
        pacer = Pacer(rpm, **pacer_options)
        transport = httpx.MockTransport(service)
        results = []
        async with batchsum.AsyncClient(key, "http://127.0.0.1:9", transport=transport, max_retries=5) as client:
            try:
                async for row in summarize_stream(texts(n), client, rpm=rpm, stats=stats, pacer=pacer):
                    results.append(row)
            except batchsum.AuthenticationError:
                pass
        return results, stats, asyncio.get_running_loop().time(), pacer

    return virtual_clock.run(main())


def uniform(lo: float, hi: float, seed: int = 0):
    rng = random.Random(seed)
    return lambda: rng.uniform(lo, hi)


def between(times, lo, hi):
    times = sorted(times)
    return bisect.bisect_left(times, hi) - bisect.bisect_left(times, lo)


def most_in_any_window(times, window):
    times = sorted(times)
    return max((bisect.bisect_left(times, t + window) - i for i, t in enumerate(times)), default=0)


INTERVAL = 60 / RPM * (1 + JITTER_MARGIN)  # the pace's spacing
PLAN_MINUTE = math.ceil(60 / INTERVAL)  # starts in the first minute at the even pace from the first start: 595
IDEAL = 1200 / RPM * 60 + 5  # rows / rpm + one answer's latency


# -- a silent service --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fixed", "bucket"])
def test_a_window_from_the_first_request_or_a_full_bucket_admits_the_catch_up_with_no_429(kind):
    service = Service(kind, latency=lambda: 5.0)
    results, stats, wall, pacer = run(service, 1200)
    assert [r.status for r in results] == ["ok"] * 1200
    assert service.refused == 0 and stats.rate_limited == 0
    # The lone first request's answer took 5 s; the rest of the first minute still holds the plan's count.
    assert service.arrivals[1] >= 5.0
    assert between(service.arrivals, 0, 60) == PLAN_MINUTE
    assert most_in_any_window(service.arrivals[:PLAN_MINUTE], 60) <= RPM
    assert wall <= 1.03 * IDEAL, wall  # virtual seconds: 126.1 against the ideal 125 (1.05x without the catch-up)
    assert pacer.pace == RPM and not pacer.changes


@pytest.mark.parametrize("kind", ["sliding", "small bucket"])
def test_a_service_that_refuses_the_catch_up_fails_no_row_and_the_pace_stays_the_plans(kind):
    service = Service("sliding" if kind == "sliding" else "bucket", latency=uniform(4, 6))
    if kind == "small bucket":
        service.limit = TokenBucket(10, 1.0)  # 600/min, but a burst of 10 at most
    results, stats, wall, pacer = run(service, 1200)
    assert [r.status for r in results] == ["ok"] * 1200
    assert max(r.attempts for r in results) == 1  # a 429 the shared pause answers costs no attempt
    # Refused near the end of the first minute (the sliding window still holds the catch-up) or
    # during it (the bucket cannot hold it), and reported as such:
    assert 0 < service.refused == stats.rate_limited, (service.refused, stats.rate_limited)
    assert pacer.pace == RPM and not [c for c in pacer.changes if c.pace < c.previous]
    # After the first minute (and the pause the 429s asked for), 45 s at the plan's pace:
    assert between(service.arrivals, 75, 120) >= math.floor(45 / (60 / RPM * (1 + JITTER_MARGIN)))


def test_a_run_that_starts_right_after_another_on_its_budget_does_not_catch_up():
    async def two_runs():
        budget = ProcessBudget(asyncio.get_running_loop().time, shared=True)
        firsts = []
        for _ in range(2):
            service = Service("fixed", latency=lambda: 5.0)
            pacer = Pacer(RPM, budget=budget)
            async with batchsum.AsyncClient(KEY, "http://127.0.0.1:9", transport=httpx.MockTransport(service)) as c:
                async for _ in summarize_stream(texts(700), c, rpm=RPM, pacer=pacer):
                    pass
            firsts.append(between(service.arrivals, service.arrivals[0], service.arrivals[0] + 60))
        return firsts

    alone, after = virtual_clock.run(two_runs())
    assert alone == PLAN_MINUTE
    assert after <= 1 + math.ceil(55 / (60 / RPM * (1 + JITTER_MARGIN)))  # even pace once the first answer is in


def test_a_share_scales_the_catch_up():
    service = Service("fixed", latency=lambda: 5.0)
    results, stats, wall, pacer = run(service, 400, share=Share("half", 0.5))
    assert service.refused == 0
    assert between(service.arrivals, 0, 60) == math.ceil(60 / (2 * INTERVAL))


# -- a service that states its room --------------------------------------------------------------------


@pytest.mark.parametrize("style", ["RateLimit-", "X-RateLimit-", "RateLimit"])
def test_the_room_a_service_states_is_used_at_once(style):
    service = Service("fixed", latency=uniform(0.4, 0.6), state_room=style)
    results, stats, wall, pacer = run(service, 300)
    assert [r.status for r in results] == ["ok"] * 300
    assert service.refused == 0
    assert wall < 3, wall  # virtual seconds: the first answer, then the other 299 at once (the even pace: 30)
    assert service.arrivals[1] >= 0.4  # the first request still went alone
    assert service.most_on_wire == 299


def test_stated_room_is_never_overspent_across_windows():
    """A limit of 200/min that states itself, told 600: the first window's room is spent at once and
    no more; the run waits for the reset, then spends the next window's."""
    service = Service("fixed", latency=uniform(0.4, 0.6), rpm=200, state_room="RateLimit-")
    results, stats, wall, pacer = run(service, 500)
    assert [r.status for r in results] == ["ok"] * 500
    assert service.refused == 0
    opened = [0.0]
    for t in service.admitted:  # the windows as the service opened them: each holds at most 200
        if t >= opened[-1] + 60:
            opened.append(t)
    counts = [between(service.admitted, o, o + 60) for o in opened]
    assert counts == [200, 200, 100], counts
    assert wall < 3 * 60


# -- a bad key ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("state_room", [None, "RateLimit-"])
def test_a_bad_key_costs_one_request(state_room):
    service = Service("fixed", latency=lambda: 5.0, state_room=state_room)
    results, stats, wall, pacer = run(service, 300, key="a-wrong-key-0123456789")
    assert len(service.arrivals) == 1


@pytest.mark.parametrize("other", ["share", "another run on the budget"])
def test_stated_room_is_left_alone_by_a_run_that_shares_the_key(other):
    """Two runs spending one statement would spend it twice: with a share below 1, or when another
    run used the budget in the last minute, starts stay evenly spaced (and so does the first minute)."""
    service = Service("fixed", latency=uniform(0.4, 0.6), state_room="RateLimit-")

    async def main():
        options = {"share": Share("part", 0.5)} if other == "share" else {}
        if other != "share":
            budget = ProcessBudget(asyncio.get_running_loop().time, shared=True)
            await budget.reserve(0.1, Report(started=5))  # another run's starts, a moment ago
            options["budget"] = budget
        pacer = Pacer(RPM, **options)
        async with batchsum.AsyncClient(KEY, "http://127.0.0.1:9", transport=httpx.MockTransport(service)) as c:
            return [row async for row in summarize_stream(texts(100), c, rpm=RPM, pacer=pacer)]

    rows = virtual_clock.run(main())
    assert [r.status for r in rows] == ["ok"] * 100 and service.refused == 0
    assert service.most_on_wire <= 8  # the even pace keeps a few on the wire, not the room's 99


def test_two_runs_starting_together_on_one_budget_do_not_catch_up():
    """Each run's first start reaches the budget at once, so a run starting beside it sees it and
    neither catches up: together they hold the plan (a sliding window refuses nothing)."""
    service = Service("sliding", latency=lambda: 5.0)

    async def main():
        budget = ProcessBudget(asyncio.get_running_loop().time, shared=True)

        async def one(seed: int):
            pacer = Pacer(RPM, budget=budget)
            rows = [f"Run {seed} text {i} has enough words in it to be worth a summary." for i in range(400)]
            async with batchsum.AsyncClient(KEY, "http://127.0.0.1:9", transport=httpx.MockTransport(service)) as c:
                return [row async for row in summarize_stream(rows, c, rpm=RPM, pacer=pacer)], pacer

        return await asyncio.gather(one(1), one(2))

    (rows_a, pacer_a), (rows_b, pacer_b) = virtual_clock.run(main())
    assert [r.status for r in rows_a + rows_b] == ["ok"] * 800
    assert service.refused == 0
    assert most_in_any_window(service.arrivals, 60) <= RPM
    # no start went faster than the pace
    assert pacer_a._first_minute.span is None and pacer_b._first_minute.span is None
