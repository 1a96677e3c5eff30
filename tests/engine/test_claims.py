"""Claims at the turn, on virtual time: runs over the same texts share a store with claims (this
process's, as the partitions of one job share it) against a simulated service with a limit per key.
A text is claimed when its turn on the pace comes; a text another run has on the wire gives the turn
to the run's next text and is awaited; a retry keeps its claim. Two runs on one key split the texts;
on two keys the fast one is not held to the slow one's pace; nothing is paid twice."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import batchsum
from batchsum.data.results import Answer
from batchsum.data.stores import MemoryClaims
from batchsum.engine import summarize_stream
from batchsum.engine.fingerprints import text_fingerprint
from batchsum.engine.lanes import KeyLane
from batchsum.engine.tally import BatchStats
from batchsum.pacing import Pacer
from batchsum.pacing.budgets.budget import ProcessBudget
from batchsum.service import contract
from batchsum.service.key_plans import parse_quota
from batchsum.service.settings import key_hash
from tests import virtual_clock
from tests.engine.test_keys import KeyedService, keys, texts

SLOW, FAST = keys(2)


def run_jobs(service: KeyedService, jobs: list[tuple[str, int, float]], store: MemoryClaims | None = None):
    """Runs over the same texts (each: its key, how many texts, the virtual second it starts), sharing
    one store with claims and a budget per key; each run's (rows, stats, virtual second it ended)."""

    async def main():
        loop = asyncio.get_running_loop()
        budgets = {key: ProcessBudget(loop.time, shared=True) for key in service.limits}
        shared = store if store is not None else MemoryClaims()

        async def one(key: str, n: int, at: float):
            await asyncio.sleep(at)
            client = batchsum.AsyncClient(key, "http://127.0.0.1:9", transport=httpx.MockTransport(service))
            lane = KeyLane(client, Pacer(service.rpm[key], budget=budgets[key]), key_hash=key_hash(key))
            stats = BatchStats()
            try:
                stream = summarize_stream(texts(n), client, stats=stats, lanes=[lane], store=shared)
                rows = [row async for row in stream]
            finally:
                await client.aclose()
            return rows, stats, loop.time()

        return await asyncio.gather(*(one(*job) for job in jobs))

    return virtual_clock.run(main())


def paid(service: KeyedService) -> int:
    return sum(service.answered.values())


def test_two_runs_over_the_same_texts_on_one_key_split_them_and_pay_each_once():
    service = KeyedService({SLOW: 600})
    (rows_a, a, _), (rows_b, b, _) = run_jobs(service, [(SLOW, 120, 0.0), (SLOW, 120, 0.0)])
    assert all(r.status == "ok" for r in rows_a + rows_b) and len(rows_a) == len(rows_b) == 120
    assert paid(service) == 120 and max(service.answered.values()) == 1  # each text once, between them
    assert a.sent + b.sent == 120 and min(a.sent, b.sent) >= 40  # split, not one waiting on the other
    assert service.refused == 0


def test_on_two_keys_the_fast_run_is_not_held_to_the_slow_ones_pace():
    """Job A on a key at 60/min, job B on another at 1200/min started 4 s later, the same 200 texts:
    B sends nearly all of them at its own pace, every row of both is ok, each text is paid once."""
    service = KeyedService({SLOW: 60, FAST: 1200})
    (rows_a, a, ended_a), (rows_b, b, ended_b) = run_jobs(service, [(SLOW, 200, 0.0), (FAST, 200, 4.0)])
    assert all(r.status == "ok" for r in rows_a + rows_b)
    assert paid(service) == 200 and max(service.answered.values()) == 1
    assert b.sent >= 170 and a.sent <= 30  # the slow key sent only what its pace let it
    assert a.reused + b.reused >= 200  # every text one run sent, the other took
    assert service.admitted[FAST] == b.sent and service.admitted[SLOW] == a.sent


def test_a_retry_after_a_429_keeps_its_claim():
    """A text refused 429 once: its retry goes at its next turn on the claim it holds (it neither
    waits on itself nor gives its turn away), and a second run over the same text takes the answer."""

    class Once(KeyedService):
        async def __call__(self, request: httpx.Request) -> httpx.Response:
            if not self.refused:
                self.refused += 1
                return httpx.Response(429, json={"error": "Too many requests"}, headers={"Retry-After": "2"})
            return await super().__call__(request)

    service = Once({SLOW: 600})
    (rows_a, a, _), (rows_b, b, _) = run_jobs(service, [(SLOW, 1, 0.0), (SLOW, 1, 0.5)])
    assert [r.status for r in rows_a + rows_b] == ["ok", "ok"]
    assert service.refused == 1 and paid(service) == 1 and a.sent + b.sent == 1


def test_a_text_claimed_by_a_run_that_lets_it_go_unanswered_is_sent_by_the_one_waiting():
    """The other run holds a text and never answers it (it stopped): its claim let go, the run that
    set the text aside takes a turn for it and sends it."""
    store = MemoryClaims()
    key = texts(3)[1]

    fingerprint = text_fingerprint(contract.parse_params(1, contract.PERCENTAGE_DEFAULT, None))(key)
    assert store.claim(fingerprint)  # another run holds it

    async def let_go() -> None:
        await asyncio.sleep(30)
        store.release(fingerprint)

    service = KeyedService({SLOW: 600})

    async def main():
        loop = asyncio.get_running_loop()
        releaser = asyncio.ensure_future(let_go())
        client = batchsum.AsyncClient(SLOW, "http://127.0.0.1:9", transport=httpx.MockTransport(service))
        lane = KeyLane(client, Pacer(600, budget=ProcessBudget(loop.time, shared=True)))
        stats = BatchStats()
        rows = [row async for row in summarize_stream(texts(3), client, stats=stats, lanes=[lane], store=store)]
        await client.aclose()
        await releaser
        return rows, stats, loop.time()

    rows, stats, ended = virtual_clock.run(main())
    assert [r.status for r in rows] == ["ok"] * 3 and stats.sent == 3 and paid(service) == 3
    assert ended >= 30  # it waited for the other run's claim, not for a lease to lapse


@pytest.mark.parametrize("limit", ["max_requests", "quota"])
def test_a_turn_given_away_gives_back_the_request_cap_the_quota_and_the_slot_in_flight(limit):
    """Every text held by another run at first: each turn goes on to the next text, and what each
    attempt took (a count on ``max_requests`` or on a configured quota, a slot in flight) is given
    back. The other run answers half of them and lets the rest go: the run sends those, within a cap
    (or a quota) of exactly that many."""
    store = MemoryClaims()
    rows = texts(40)

    identify = text_fingerprint(contract.parse_params(1, contract.PERCENTAGE_DEFAULT, None))
    keys = [identify(text) for text in rows]
    assert all(store.claim(key) for key in keys)  # another run has every text on the wire

    async def the_other_run() -> None:
        await asyncio.sleep(20)
        for i, key in enumerate(keys):
            if i % 2 == 0:
                store.put(key, Answer("Theirs.", "ok", None, None, 200, 1))
            store.release(key)

    service = KeyedService({SLOW: 600})

    async def main():
        loop = asyncio.get_running_loop()
        other = asyncio.ensure_future(the_other_run())
        client = batchsum.AsyncClient(SLOW, "http://127.0.0.1:9", transport=httpx.MockTransport(service))
        budget = ProcessBudget(loop.time, shared=True)
        quota = parse_quota("20/day") if limit == "quota" else None
        lane = KeyLane(client, Pacer(600, budget=budget), quota=quota, budget=budget)
        stats = BatchStats()
        cap = 20 if limit == "max_requests" else None
        stream = summarize_stream(rows, client, stats=stats, lanes=[lane], store=store, max_requests=cap)
        found = [row async for row in stream]
        await client.aclose()
        await other
        return found, stats

    found, stats = virtual_clock.run(main())
    assert [r.status for r in found] == ["ok"] * 40
    assert stats.sent == 20 and paid(service) == 20 and stats.reused == 20
    assert [r.summary for r in found[::2]] == ["Theirs."] * 20
