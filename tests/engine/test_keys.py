"""Several keys in one run, on virtual time: the engine, the clients and a pacer per key end to end
against a simulated service with a limit per key (``httpx.MockTransport``, answers taking virtual
seconds). Each key keeps the spacing rule on its own budget (shared with every run using the key,
overlapping key sets included), the run uses the keys' summed paces, each key's first request goes
alone and every key's at once, a key refused mid-run leaves the run and its requests go to the
others, and nothing is paid twice."""

from __future__ import annotations

import asyncio
import math
import random

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import batchsum
from batchsum.engine import summarize_stream
from batchsum.engine.lanes import KeyLane
from batchsum.engine.tally import BatchStats
from batchsum.local.state import LIMIT_KINDS
from batchsum.pacing import Pacer
from batchsum.pacing.budgets.budget import ProcessBudget
from batchsum.service import contract
from batchsum.service.contract import Messages
from batchsum.service.errors import explain
from batchsum.service.settings import key_hash
from tests import virtual_clock
from tests.pacing.test_pace_conformance import most_in_any_window

SUITE = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
LIMITS = (60, 120, 180, 300, 600)


def keys(n: int) -> list[str]:
    return [f"team-key-{i}-0123456789abcdef" for i in range(n)]


class KeyedService:
    """A service with a strict limit per key (of ``kind``), decided at arrival; answers after
    ``latency()``; a key may expire after its ``expires[key]``-th admitted request (401 "you are not
    premium for this request")."""

    def __init__(self, limits: dict[str, int], *, kind: str = "sliding", latency=None, seed: int = 0):
        self.limits = {key: LIMIT_KINDS[kind](rpm, 60.0) for key, rpm in limits.items()}
        self.rpm = dict(limits)
        rng = random.Random(seed)
        self.latency = latency or (lambda: rng.uniform(0.3, 0.7))
        self.expires: dict[str, int] = {}
        self.arrivals: dict[str, list[float]] = {key: [] for key in limits}
        self.admitted: dict[str, int] = {key: 0 for key in limits}
        self.refused = 0
        self.unauthorized: dict[str, int] = {key: 0 for key in limits}
        self.answered: dict[str, int] = {}  # text -> times answered 200

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        now = asyncio.get_running_loop().time()
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        if key not in self.limits:
            return httpx.Response(401, json={"type": "invalid_request", "message": Messages.INVALID_KEY})
        self.arrivals[key].append(now)
        if key in self.expires and self.admitted[key] >= self.expires[key]:
            self.unauthorized[key] += 1
            await asyncio.sleep(self.latency())
            return httpx.Response(401, json={"type": "invalid_request", "message": Messages.NOT_PREMIUM})
        wait = self.limits[key].admit(now)
        if wait is None:
            self.admitted[key] += 1  # decided at arrival, as the plan's count is
        await asyncio.sleep(self.latency())
        if wait is not None:
            self.refused += 1
            return httpx.Response(429, json={"error": Messages.RATE_LIMITED}, headers={"Retry-After": "1"})
        text = httpx.Request("POST", "http://x", content=request.content).read().decode()
        self.answered[text] = self.answered.get(text, 0) + 1
        return httpx.Response(200, json={contract.FIELD_RESULT: "A summary."})


def texts(n: int, run: int = 0) -> list[str]:
    return [f"Team run {run} text {i} has enough words in it to be worth a summary of its own." for i in range(n)]


def lanes_for(service: KeyedService, chosen: list[str], budgets: dict[str, ProcessBudget], clients) -> list[KeyLane]:
    lanes = []
    for key in chosen:
        client = batchsum.AsyncClient(key, "http://127.0.0.1:9", transport=httpx.MockTransport(service), max_retries=8)
        clients.append(client)
        pacer = Pacer(service.rpm[key], budget=budgets[key])
        lanes.append(KeyLane(client, pacer, key_hash=key_hash(key), source=f"key {key[9]}"))
    return lanes


def run_keys(service: KeyedService, runs: list[tuple[list[str], int]], tell=None):
    """Runs at once, each over its keys and its number of texts, a shared budget per key (as every
    process on the machine shares it); (rows of each run, lanes of each run, stats of each run)."""

    async def main():
        loop = asyncio.get_running_loop()
        budgets = {key: ProcessBudget(loop.time, shared=True) for key in service.limits}
        clients: list[batchsum.AsyncClient] = []

        async def one(number: int, chosen: list[str], n: int):
            lanes = lanes_for(service, chosen, budgets, clients)
            for lane in lanes:
                lane.tell = tell
            stats = BatchStats()
            stream = summarize_stream(texts(n, number), lanes[0].client, stats=stats, lanes=lanes)
            rows = [row async for row in stream]
            return rows, lanes, stats

        try:
            return await asyncio.gather(*(one(i, chosen, n) for i, (chosen, n) in enumerate(runs)))
        finally:
            for client in clients:
                await client.aclose()

    return virtual_clock.run(main())


def assert_spacing_per_key(service: KeyedService) -> None:
    """At most ceil(rpm*w/60)+1 starts of a key in any w of 1, 10 and 60 s, at the service."""
    for key, times in service.arrivals.items():
        for width in (1.0, 10.0, 60.0):
            allowed = math.ceil(service.rpm[key] * width / 60 - 1e-9) + 1
            assert most_in_any_window(times, width) <= allowed, (key, width)


@pytest.mark.slow
@SUITE
@given(
    limits=st.lists(st.sampled_from(LIMITS), min_size=1, max_size=5),
    processes=st.integers(1, 3),
    kind=st.sampled_from(["sliding", "fixed", "bucket", "clock-10s"]),
    seed=st.integers(0, 10**6),
)
def test_each_key_keeps_its_own_spacing_and_the_run_uses_the_summed_paces(limits, processes, kind, seed):
    named = dict(zip(keys(len(limits)), limits))
    service = KeyedService(named, kind=kind, seed=seed)
    total = sum(limits)
    n = max(60 * processes, min(300, total // 2))
    done = run_keys(service, [(list(named), n // processes)] * processes)
    for rows, lanes, _ in done:
        assert [r.status for r in rows] == ["ok"] * (n // processes)
        assert all(lane.refusal is None and lane.rate_limited == 0 for lane in lanes)
    assert service.refused == 0
    assert_spacing_per_key(service)
    # Utilization: after every key's lone first requests and while every key has rows left to send
    # (until the first key's last start: then the run is in its tail), the starts run at the summed paces.
    since = max(times[processes - 1] for times in service.arrivals.values()) + 0.8
    until = min(times[-1] for times in service.arrivals.values())
    if until - since >= 10:
        count = sum(1 for times in service.arrivals.values() for t in times if since <= t < until)
        per_minute = count / (until - since) * 60
        assert per_minute >= 0.97 * total / 1.01, (per_minute, total)  # (the spacing's 1% margin)


@pytest.mark.slow
def test_overlapping_key_sets_in_two_runs_share_the_key_they_have_in_common():
    """Run 1 has keys A and B, run 2 has B alone: B's limit holds for both together, and run 1 sends
    more on A, where it has room."""
    a, b = keys(2)
    service = KeyedService({a: 300, b: 300})
    (rows1, lanes1, _), (rows2, lanes2, _) = run_keys(service, [([a, b], 300), ([b], 150)])
    assert [r.status for r in rows1 + rows2] == ["ok"] * 450
    assert service.refused == 0
    assert_spacing_per_key(service)
    on_a, on_b = lanes1[0].requests, lanes1[1].requests
    assert on_a > on_b  # B is shared with run 2: run 1 gets about half of it, and the rest of A
    assert lanes2[0].requests == 150


def test_every_keys_first_request_goes_alone_and_all_keys_at_once():
    chosen = keys(3)
    service = KeyedService(dict(zip(chosen, (120, 180, 300))), latency=lambda: 2.0)
    run_keys(service, [(chosen, 60)])
    firsts = sorted(times[0] for times in service.arrivals.values())
    assert firsts[-1] < 1.0  # all three keys' first requests went out at once
    for times in service.arrivals.values():
        assert times[1] >= times[0] + 2.0  # nothing more on a key before its first answer


@pytest.mark.slow
def test_a_key_whose_plan_expires_mid_run_leaves_and_the_others_finish_the_job():
    chosen = keys(3)
    service = KeyedService(dict(zip(chosen, (120, 180, 300))))
    service.expires[chosen[1]] = 50
    told: list[str] = []
    [(rows, lanes, stats)] = run_keys(service, [(chosen, 600)], tell=told.append)
    assert [r.status for r in rows] == ["ok"] * 600
    assert service.admitted[chosen[1]] == 50
    assert 1 <= service.unauthorized[chosen[1]] <= 16  # its requests in flight at most
    assert max(service.answered.values()) == 1 and len(service.answered) == 600  # none paid twice
    refused = [lane for lane in lanes if lane.refusal is not None]
    assert [lane.key_hash for lane in refused] == [key_hash(chosen[1])]
    assert refused[0].refusal == Messages.NOT_PREMIUM
    assert len(told) == 1 and key_hash(chosen[1]) in told[0] and Messages.NOT_PREMIUM in told[0]
    assert not any(chosen[1][i : i + 10] in told[0] for i in range(len(chosen[1]) - 9))
    assert stats.rate_limited == 0 and service.refused == 0
    # What was billed is what the service answered; its refusals of the expired plan were not billed,
    # and each was sent again on another key (a retry), and used the rate as a plan's 401 may.
    refusals = service.unauthorized[chosen[1]]
    assert stats.paid == sum(service.admitted.values()) == 600
    assert stats.requests == 600 + refusals and stats.outcomes["not_premium"] == refusals
    assert stats.used_rate == 600 + refusals


def test_the_cap_counts_what_was_billed_so_a_revoked_keys_refusals_are_given_back():
    """Three keys, one whose plan expires after 15 requests, ``max_requests`` 100: the service
    answers exactly 100 summaries (its refusals of the expired plan gave their counts back)."""
    chosen = keys(3)
    service = KeyedService(dict(zip(chosen, (120, 180, 300))))
    service.expires[chosen[1]] = 15

    async def main():
        loop = asyncio.get_running_loop()
        budgets = {key: ProcessBudget(loop.time, shared=True) for key in chosen}
        clients: list = []
        lanes = lanes_for(service, chosen, budgets, clients)
        stats, rows = BatchStats(), []
        try:
            async for row in summarize_stream(texts(300), lanes[0].client, stats=stats, lanes=lanes, max_requests=100):
                rows.append(row)
        except batchsum.RequestCapReached:
            pass
        finally:
            for client in clients:
                await client.aclose()
        return rows, stats

    rows, stats = virtual_clock.run(main())
    assert service.unauthorized[chosen[1]] >= 1  # the expiry came inside the capped run
    assert sum(service.admitted.values()) == [r.status for r in rows].count("ok") == stats.paid == 100


def test_every_key_refused_stops_the_run_as_one_key_does():
    chosen = keys(2)
    service = KeyedService(dict(zip(chosen, (120, 120))))
    service.expires = {chosen[0]: 5, chosen[1]: 5}

    async def main():
        loop = asyncio.get_running_loop()
        budgets = {key: ProcessBudget(loop.time, shared=True) for key in chosen}
        clients: list = []
        lanes = lanes_for(service, chosen, budgets, clients)
        rows = []
        try:
            async for row in summarize_stream(texts(100), lanes[0].client, lanes=lanes):
                rows.append(row)
        except batchsum.NotPremiumError as exc:
            return rows, exc
        return rows, None

    rows, error = virtual_clock.run(main())
    assert error is not None  # the last key's refusal stops the run, raised after the rows finished in order
    assert all(r.status == "ok" for r in rows)
    assert list(service.admitted.values()) == [5, 5] and all(1 <= n <= 16 for n in service.unauthorized.values())
    # Its explanation names the last key as every line does, never $BATCHSUM_API_KEY.
    said = explain(error)
    assert said.startswith("every key of the run was refused (2); the last, key ") and "BATCHSUM_API_KEY" not in said


class OneQuota429(KeyedService):
    """Each key at its limit; ``key``'s ``after``-th request answered 429 asking for ``wait`` s (a
    quota of its own spent until then), once."""

    def __init__(self, limits: dict[str, int], key: str, after: int, wait: int) -> None:
        super().__init__(limits)
        self.key, self.after, self.wait = key, after, wait

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        if key == self.key and len(self.arrivals[key]) == self.after:
            self.arrivals[key].append(asyncio.get_running_loop().time())
            self.refused += 1
            return httpx.Response(429, json={"error": Messages.RATE_LIMITED}, headers={"Retry-After": str(self.wait)})
        return await super().__call__(request)


@pytest.mark.slow
def test_a_key_back_from_a_quotas_reset_reports_no_quota_spent():
    """Key A's quota is spent for 130 s mid-run (B goes on), then A is back and sends again: the
    report's keys and the progress line say nothing of a quota spent any more."""
    a, b = keys(2)
    service = OneQuota429({a: 60, b: 60}, a, after=5, wait=130)
    told: list[str] = []

    async def main():
        loop = asyncio.get_running_loop()
        budgets = {key: ProcessBudget(loop.time, shared=True) for key in (a, b)}
        clients: list = []
        lanes = lanes_for(service, [a, b], budgets, clients)
        for lane in lanes:
            lane.tell = told.append
        try:
            rows = [row async for row in summarize_stream(texts(300), lanes[0].client, lanes=lanes)]
            return rows, lanes[0], lanes[0].describe(), lanes[0].state()  # as the run's report reads them
        finally:
            for client in clients:
                await client.aclose()

    rows, back, described, state = virtual_clock.run(main())
    assert [r.status for r in rows] == ["ok"] * 300 and service.refused == 1
    assert back.spent is not None and back.requests > 6  # it left, and came back to send more
    assert described["quota_spent_until"] is None and described["quota"] is None
    assert "quota spent" not in state and any("leaves the run" in line for line in told)
