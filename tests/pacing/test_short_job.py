"""The short job on virtual time: the engine, the client and the pacer end to end against a simulated
service (an ``httpx.MockTransport`` whose answers take virtual seconds), so a run of minutes takes a
second and every count is exact. No real server can run on a virtual clock; the same service kinds
over loopback are in ``test_local_limits.py``.

- A silent service: starts evenly spaced from the first one, whatever window it counts in; a new key's
  first request goes alone, a key proven answered by the service in this mode within a day does not
  wait for it (``pacing.KeyRecord``), and one refused since costs one answer's time of starts, none paid.
- A stating service (``RateLimit-Remaining``/``-Reset``): its room is used at once, at most ten times
  the plan, never past what it states; a liar's room is distrusted after its first 429.
- A bad key costs exactly one request either way."""

from __future__ import annotations

import asyncio
import bisect
import math
import random

import httpx
import pytest

import batchsum
from batchsum.engine import summarize_stream
from batchsum.engine.tally import BatchStats
from batchsum.local.state import LIMIT_KINDS, TokenBucket
from batchsum.pacing import JITTER_MARGIN, ROOM_SPEEDUP, KeyRecord, Pacer
from batchsum.pacing.budgets.budget import ProcessBudget, Remembered, Share
from batchsum.service import contract
from batchsum.service.contract import Messages
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


def run(
    service: Service, n: int, *, key: str = KEY, rpm: float = RPM, record: KeyRecord | None = None, **pacer_options
):
    """``n`` texts through ``summarize_stream`` at ``rpm``; (results, stats, virtual seconds, pacer).
    ``record``: the key's record at the service (a proof, a distrust), as a run opens it."""

    async def main():
        stats = BatchStats()
        pacer = Pacer(rpm, record=record, **pacer_options)
        transport = httpx.MockTransport(service)
        results = []
        async with batchsum.AsyncClient(key, "http://127.0.0.1:9", transport=transport, max_retries=5) as client:
            try:
                stream = summarize_stream(texts(n), client, rpm=rpm, stats=stats, pacer=pacer, record=record)
                async for row in stream:
                    results.append(row)
            except batchsum.AuthenticationError:
                pass
        return results, stats, asyncio.get_running_loop().time(), pacer

    return virtual_clock.run(main())


class Remembering(ProcessBudget):
    """A budget that remembers what runs tell it, in memory (the machine's does in its file)."""

    def __init__(self) -> None:
        super().__init__()
        self.told: dict[str, str] = {}

    async def remember(self, key_hash: str, service: str, entries: dict[str, str]) -> None:
        self.told.update(entries)


def record_of(*names: str, age: float = 60.0) -> KeyRecord:
    """A key's record at the service as its budget remembers it: ``names`` written ``age`` s ago."""
    import time

    entries = [Remembered("keyhash", "https://svc", name, "", time.time() - age) for name in names]
    return KeyRecord(Remembering(), "keyhash", "https://svc", entries)


def told(record: KeyRecord) -> set[str]:
    """What the run told the key's record (written, or still to write)."""
    assert isinstance(record.budget, Remembering)
    return set(record.budget.told) | set(record.pending)


def gaps(times):
    times = sorted(times)
    return [b - a for a, b in zip(times, times[1:])]


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
IDEAL = 1200 / RPM * 60 + 5  # rows / rpm + one answer's latency: the even pace's ideal for 1200 texts


# -- a silent service --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sliding", "fixed", "bucket", "small bucket"])
def test_a_new_key_sends_its_first_request_alone_then_every_start_is_spaced_and_nothing_is_refused(kind):
    service = Service("bucket" if kind == "small bucket" else kind, latency=uniform(4, 6))
    if kind == "small bucket":
        service.limit = TokenBucket(10, 1.0)  # 600/min, but a burst of 10 at most: the strictest bucket
    results, stats, wall, pacer = run(service, 1200)
    assert [r.status for r in results] == ["ok"] * 1200
    assert service.refused == 0 and stats.rate_limited == 0
    first_answer = service.arrivals[1]
    assert first_answer >= 4.0  # the lone first request's answer came first
    assert min(gaps(service.arrivals[1:])) >= INTERVAL - 1e-9  # then starts at the pace, never closer
    for window in (1, 10, 60):
        assert most_in_any_window(service.arrivals, window) <= math.ceil(RPM * window / 60)
    assert wall <= 1.03 * (IDEAL + first_answer), wall  # virtual seconds
    assert pacer.pace == RPM and not pacer.changes


def test_a_proven_key_starts_at_the_pace_with_the_rest():
    service = Service("sliding", latency=uniform(4, 6))
    record = record_of("answered:1")
    results, stats, wall, pacer = run(service, 1200, record=record)
    assert [r.status for r in results] == ["ok"] * 1200 and service.refused == 0
    assert service.arrivals[1] < 1.0  # no wait for the first answer
    assert min(gaps(service.arrivals)) >= INTERVAL - 1e-9
    assert wall <= 1.03 * IDEAL, wall  # virtual seconds: rows / rpm + one answer
    assert told(record) == {"answered:1"}


@pytest.mark.parametrize(
    ("names", "alone"),
    [
        ((), True),  # a new key
        (("answered:2",), True),  # answered, but in another mode
        (("answered:1", "refused"), True),  # refused since (written after: the same age, later in order)
        (("answered:1", "refused:1"), True),  # the plan refused this mode since
        (("answered:1",), False),
    ],
)
def test_only_a_key_answered_in_this_mode_and_not_refused_since_skips_the_lone_first_request(names, alone):
    import time

    now = time.time()
    entries = [Remembered("k", "s", name, "", now - 100 + i) for i, name in enumerate(names)]
    record = KeyRecord(ProcessBudget(), "k", "s", entries)
    assert (record.proven(1) is None) == alone
    service = Service("sliding", latency=lambda: 5.0)
    run(service, 20, record=record)
    assert (service.arrivals[1] >= 5.0) == alone


def test_a_proof_older_than_a_day_is_not_used():
    record = record_of("answered:1", age=86400 + 60)
    assert record.proven(1) is None
    assert "alone" in record.describe(1) and "at the pace" in record_of("answered:1").describe(1)


def test_a_key_refused_since_it_was_proven_costs_one_answers_time_of_starts_none_paid():
    """The record proves the key, but the service now refuses it: the run starts at the pace, and
    what went out before the first 401 came back is all it costs; nothing is paid, and the record
    says the key was refused, so the next run's first request goes alone."""
    service = Service("sliding", latency=lambda: 5.0, key="the-key-the-service-now-knows")
    record = record_of("answered:1")
    results, stats, wall, pacer = run(service, 1200, record=record)
    assert service.admitted == []  # none paid
    assert len(service.arrivals) <= math.ceil(5.0 / INTERVAL) + 1  # one answer's time of starts
    assert told(record) == {"refused"}


def test_a_share_holds_its_part_of_the_pace_with_every_start_spaced():
    service = Service("fixed", latency=lambda: 5.0)
    results, stats, wall, pacer = run(service, 200, share=Share("half", 0.5))
    assert service.refused == 0
    assert min(gaps(service.arrivals[1:])) >= 2 * INTERVAL - 1e-9


def test_two_runs_starting_together_on_one_budget_hold_the_plan_between_them():
    """Two runs on one budget start together: their starts interleave, never closer than the pace's
    interval, and a sliding window of the plan refuses nothing."""
    service = Service("sliding", latency=lambda: 5.0)

    async def main():
        budget = ProcessBudget(asyncio.get_running_loop().time, shared=True)

        async def one(seed: int):
            pacer = Pacer(RPM, budget=budget)
            rows = [f"Run {seed} text {i} has enough words in it to be worth a summary." for i in range(400)]
            async with batchsum.AsyncClient(KEY, "http://127.0.0.1:9", transport=httpx.MockTransport(service)) as c:
                return [row async for row in summarize_stream(rows, c, rpm=RPM, pacer=pacer)]

        return await asyncio.gather(one(1), one(2))

    rows_a, rows_b = virtual_clock.run(main())
    assert [r.status for r in rows_a + rows_b] == ["ok"] * 800
    assert service.refused == 0
    assert min(gaps(service.arrivals)) >= INTERVAL - 1e-9


# -- a service that states its room --------------------------------------------------------------------


@pytest.mark.parametrize("style", ["RateLimit-", "X-RateLimit-", "RateLimit"])
def test_the_room_a_service_states_is_used_at_once_at_most_ten_times_the_plan(style):
    service = Service("sliding", latency=uniform(0.4, 0.6), state_room=style)
    results, stats, wall, pacer = run(service, 300)
    assert [r.status for r in results] == ["ok"] * 300
    assert service.refused == 0
    assert wall < 5, wall  # virtual seconds: the first answer, then 299 at ten times the plan (the even pace: 30)
    assert service.arrivals[1] >= 0.4  # the first request still went alone
    assert min(gaps(service.arrivals[1:])) >= INTERVAL / ROOM_SPEEDUP - 1e-9


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


class Liar(Service):
    """A strict sliding window that states ``Remaining: 999999`` in every answer, 429s included."""

    def room_headers(self, now: float) -> dict[str, str]:
        return {"RateLimit-Limit": "999999", "RateLimit-Remaining": "999999", "RateLimit-Reset": "10"}


def test_a_service_lying_about_its_room_costs_a_handful_of_429s_once():
    service = Liar("sliding", latency=lambda: 0.2, rpm=120, state_room="RateLimit-")
    service.limit = LIMIT_KINDS["sliding"](20, 10.0)  # 20 in any 10 s
    record = record_of()
    results, stats, wall, pacer = run(service, 100, rpm=120, record=record)
    assert [r.status for r in results] == ["ok"] * 100
    assert service.refused <= 10, service.refused
    assert wall <= 60, wall
    assert told(record) == {"answered:1", "room_contradicted"}
    assert any("room" in str(change) for change in pacer.changes)


def test_a_statement_contradicted_in_an_earlier_run_is_not_used():
    service = Service("sliding", latency=uniform(0.4, 0.6), state_room="RateLimit-")
    results, stats, wall, pacer = run(service, 100, record=record_of("room_contradicted"))
    assert service.refused == 0
    assert min(gaps(service.arrivals[1:])) >= INTERVAL - 1e-9  # the even pace: the room is not believed
    assert service.most_on_wire <= 8


# -- a bad key ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("state_room", [None, "RateLimit-"])
def test_a_bad_key_costs_one_request(state_room):
    service = Service("fixed", latency=lambda: 5.0, state_room=state_room)
    results, stats, wall, pacer = run(service, 300, key="a-wrong-key-0123456789")
    assert len(service.arrivals) == 1


@pytest.mark.parametrize("other", ["share", "another run on the budget"])
def test_stated_room_is_left_alone_by_a_run_that_shares_the_key(other):
    """Two runs spending one statement would spend it twice: with a share below 1, or when another
    run used the budget in the last minute, starts stay evenly spaced."""
    service = Service("fixed", latency=uniform(0.4, 0.6), state_room="RateLimit-")

    async def main():
        options = {"share": Share("part", 0.5)} if other == "share" else {}
        if other != "share":
            budget = ProcessBudget(asyncio.get_running_loop().time, shared=True)
            for _ in range(5):  # another run's starts, a moment ago
                await budget.reserve(0.0)
            options["budget"] = budget
        pacer = Pacer(RPM, **options)
        async with batchsum.AsyncClient(KEY, "http://127.0.0.1:9", transport=httpx.MockTransport(service)) as c:
            return [row async for row in summarize_stream(texts(100), c, rpm=RPM, pacer=pacer)]

    rows = virtual_clock.run(main())
    assert [r.status for r in rows] == ["ok"] * 100 and service.refused == 0
    assert service.most_on_wire <= 8  # the even pace keeps a few on the wire, not the room's 99
