"""Quotas longer than a minute, on virtual time: a quota the service states never passes for a
per-minute limit (issue 40: under ``rpm="auto"`` it never raises the pace, and nothing remembers it
as the key's limit), and quotas stated or configured take their key out of a run until their reset,
said once. On every kind of budget (a SQLite file, a real redis-server): the counts, and what a
budget that comes back empty gets back from the runs that saw them; and through the command line."""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import batchsum
from batchsum.engine import summarize_stream
from batchsum.engine.lanes import KeyLane
from batchsum.engine.tally import BatchStats
from batchsum.errors import QuotaSpent
from batchsum.local.state import SlidingWindow
from batchsum.pacing import Pacer
from batchsum.pacing.auto.key_record import LIMIT, QUOTA, QUOTA_SPENT
from batchsum.pacing.budgets.budget import Budget, ProcessBudget, RedisBudget, SQLiteBudget
from batchsum.pacing.budgets.quota import CountedQuota, StatedQuota
from batchsum.run.progress import ProgressBar
from batchsum.service import contract
from batchsum.service.contract import Messages
from batchsum.service.key_plans import Quota, parse_quota, period_window
from tests import virtual_clock
from tests.engine.test_keys import KeyedService
from tests.engine.test_keys import keys as team_keys
from tests.pacing.test_pace_conformance import most_in_any_window
from tests.pacing.test_short_job import KEY, Service, record_of, told, uniform
from tests.support import KEY as PREMIUM
from tests.support import article

KEYS = team_keys(1)
ROOT = Path(__file__).resolve().parents[2]


def texts(n: int, seed: int = 0) -> list[str]:
    return [f"Quota text {seed}-{i} has enough words in it to be worth a summary of its own." for i in range(n)]


class QuotaStating(Service):
    """A strict sliding minute that also states a quota in every answer: by default 10000 with no
    window and a reset hours away (``X-RateLimit-*``); or the ``fixed`` headers given (a daily quota
    in the list form, say): a quota, not a per-minute limit."""

    def __init__(self, rpm: int, seed: int = 0, fixed: dict[str, str] | None = None) -> None:
        super().__init__("sliding", latency=uniform(0.3, 0.7, seed), rpm=rpm)
        self.limit = SlidingWindow(rpm, 60.0)
        self.used = 0
        self.fixed = fixed

    def room_headers(self, now: float) -> dict[str, str]:
        self.used += 1
        if self.fixed is not None:
            return dict(self.fixed)
        return {
            "X-RateLimit-Limit": "10000",
            "X-RateLimit-Remaining": str(10000 - self.used),
            "X-RateLimit-Reset": str(int(time.time()) + 5 * 3600),
        }


# Quotas stated with no per-minute window beside them (issue 40's rule: a statement is per minute when
# its window is at most 60 s, or it has none and its reset is at most 60 s away; a value that is the
# limit of a longer window stated beside it is that window's).
LONG_ONLY = {
    "the issue's list form: 30 a day": {"RateLimit-Limit": "30, 30;w=86400"},
    "a bare limit with a daily policy": {"RateLimit-Limit": "100", "RateLimit-Policy": "100;w=86400"},
    "draft-07 with a daily policy, room resetting in 30 s": {
        "RateLimit": "limit=100, remaining=90, reset=30",
        "RateLimit-Policy": "100;w=86400",
    },
}


def run_auto(service: Service, n: int, record=None):
    async def main():
        pacer = Pacer(1_000_000.0, auto=True, record=record)
        transport = httpx.MockTransport(service)
        async with batchsum.AsyncClient(KEY, "http://127.0.0.1:9", transport=transport) as client:
            stream = summarize_stream(texts(n), client, rpm=1_000_000.0, pacer=pacer, record=record)
            rows = [row async for row in stream]
        return rows, pacer

    return virtual_clock.run(main())


@pytest.mark.slow
@pytest.mark.parametrize("fixed", [None, *LONG_ONLY.values()], ids=["X-RateLimit, reset hours away", *LONG_ONLY])
def test_under_auto_a_stated_quota_with_no_window_and_a_reset_hours_away_is_no_per_minute_limit(fixed):
    """Issue 40: ``X-RateLimit-Limit: 10000`` with a reset hours away is a quota, and so is a limit
    stated for a day only. The run goes exactly as against a service that states nothing (no pace
    raised to 10000 or lowered to 30, no storm of 429s), and the key's record remembers nothing stated."""
    silent = Service("sliding", latency=uniform(0.3, 0.7), rpm=240)
    silent.limit = SlidingWindow(240, 60.0)
    stating = QuotaStating(240, fixed=fixed)
    quiet_rows, quiet_pacer = run_auto(silent, 400)
    record = record_of()
    rows, pacer = run_auto(stating, 400, record=record)
    assert [r.status for r in rows] == ["ok"] * 400
    assert stating.arrivals == silent.arrivals  # the statement changed nothing of the pace
    assert stating.refused == silent.refused <= 12
    assert max(change.pace for change in pacer.changes) < 1000
    assert not any("stated" in str(change) for change in pacer.changes)
    assert "stated" not in pacer.auto.describe()
    remembered = record.pending.get(LIMIT) or record.budget.told.get(LIMIT)  # type: ignore[attr-defined]
    assert remembered is None or '"stated"' not in remembered
    assert LIMIT not in told(record) or "10000" not in str(remembered)


@pytest.mark.parametrize("headers", LONG_ONLY.values(), ids=LONG_ONLY.keys())
def test_a_quota_stated_for_a_day_only_never_lowers_a_configured_pace(headers):
    """``--rpm 600`` against a service that states a daily quota and no per-minute limit, in the
    forms above: the pace stays 600 (no "30/min stated"), and no row waits for a pause."""
    service = QuotaStating(600, fixed=headers)
    service.limit = SlidingWindow(10**6, 60.0)

    async def main():
        pacer = Pacer(600)
        transport = httpx.MockTransport(service)
        async with batchsum.AsyncClient(KEY, "http://127.0.0.1:9", transport=transport) as client:
            rows = [row async for row in summarize_stream(texts(60), client, rpm=600, pacer=pacer)]
        return rows, pacer

    rows, pacer = virtual_clock.run(main())
    assert [r.status for r in rows] == ["ok"] * 60 and service.refused == 0
    assert pacer.pace == 600 and pacer.ceiling == 600 and not pacer.changes
    assert most_in_any_window(service.arrivals, 60.0) == 60  # all sent in the first minute, at 600/min


# -- quotas longer than a minute on a run's keys ------------------------------------------------------


class DailyQuota(KeyedService):
    """A key at ``rpm`` with a quota of ``quota`` admitted requests a day: stated in the list form in
    every answer (``stated``), or not stated (a 429 with a Retry-After of what is left of the day),
    and refused at once; ``retry_after`` replaces that wait (a quota of an hour, say)."""

    def __init__(self, rpm: int, quota: int, *, stated: bool, retry_after: float | None = None):
        super().__init__({KEYS[0]: rpm})
        self.quota, self.stated, self.wait, self.used = quota, stated, retry_after, 0
        self.opened: float | None = None

    def headers(self, now: float) -> dict[str, str]:
        if not self.stated:
            return {}
        reset = math.ceil(86400 - (now - (self.opened or now)))
        return {
            "RateLimit-Limit": f"{self.quota}, {self.rpm[KEYS[0]]};w=60, {self.quota};w=86400",
            "RateLimit-Remaining": str(self.quota - self.used),
            "RateLimit-Reset": str(reset),
        }

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        now = asyncio.get_running_loop().time()
        self.opened = now if self.opened is None else self.opened
        if self.used >= self.quota:
            self.arrivals[KEYS[0]].append(now)
            self.refused += 1
            wait = self.wait if self.wait is not None else 86400 - (now - self.opened)
            return httpx.Response(
                429,
                json={"error": Messages.RATE_LIMITED},
                headers={"Retry-After": str(math.ceil(wait)), **self.headers(now)},
            )
        self.used += 1
        response = await super().__call__(request)
        response.headers.update(self.headers(asyncio.get_running_loop().time()))
        return response


def run_quota(
    service, n: int, *, max_wait: float = 1800.0, quota: Quota | None = None, budget=None, record=None, rpm=None,
    budget_type=ProcessBudget,
):  # fmt: skip
    """``n`` texts on the one key at ``rpm`` (the service's for it); (rows, the error the run stopped
    with, the key's lane, virtual seconds). ``budget_type``: the budget made on the loop's clock
    when ``budget`` is None."""

    async def main():
        loop = asyncio.get_running_loop()
        shared = budget or budget_type(loop.time, shared=True)
        client = batchsum.AsyncClient(KEYS[0], "http://127.0.0.1:9", transport=httpx.MockTransport(service))
        pacer = Pacer(rpm or service.rpm[KEYS[0]], budget=shared)
        lane = KeyLane(client, pacer, record=record, quota=quota, budget=shared)
        rows, error = [], None
        try:
            stream = summarize_stream(texts(n), client, lanes=[lane], max_wait=max_wait)
            async for row in stream:
                rows.append(row)
        except QuotaSpent as exc:
            error = exc
        finally:
            await client.aclose()
        return rows, error, lane, loop.time()

    return virtual_clock.run(main())


@pytest.mark.slow
def test_a_quota_stated_in_the_list_form_stops_the_run_at_its_last_request_with_no_429():
    service = DailyQuota(600, 300, stated=True)
    rows, error, lane, wall = run_quota(service, 1000)
    assert [r.status for r in rows].count("ok") == 300
    assert [r.error for r in rows if r.status != "ok"] == ["not_sent"] * 700
    assert service.refused == 0 and service.admitted[KEYS[0]] == 300
    assert error is not None and error.remaining == 700
    assert "daily quota of 300 (stated by the service)" in str(error) and "UTC" in str(error)
    assert lane.spent is not None and lane.spent.until > time.time() + 86000


def test_a_quota_unstated_stops_the_run_after_one_429_whose_retry_after_is_a_day():
    service = DailyQuota(600, 300, stated=False)
    rows, error, lane, _ = run_quota(service, 1000)
    assert [r.status for r in rows].count("ok") == 300
    assert [r.error for r in rows if r.status != "ok"] == ["not_sent"] * 700
    assert 1 <= service.refused <= 3
    assert error is not None and "asking to wait" in str(error) and lane.rate_limited == service.refused
    assert lane.pacer.pace == 600  # the quota's 429 lowered nothing of the per-minute pace


class SpentElsewhere(DailyQuota):
    """The same daily quota, stated in every answer, of which another machine on the key (on no
    budget of ours) spends ``burst`` at once after our ``after``-th request."""

    def __init__(self, rpm: int, quota: int, *, after: int, burst: int) -> None:
        super().__init__(rpm, quota, stated=True)
        self.after, self.burst = after, burst

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.admitted[KEYS[0]] == self.after:
            self.used, self.after = self.used + self.burst, -1
        return await super().__call__(request)


def test_a_stated_quota_another_machine_spends_stops_the_run_at_the_answer_saying_none_is_left():
    """What others spend shows in each answer's room: the latest figure is kept (never our own count
    from an earlier one), and the 200 that says none is left takes the key out before any request of
    ours is refused."""
    service = SpentElsewhere(60, 300, after=10, burst=280)
    rows, error, lane, _ = run_quota(service, 100)
    assert error is not None and "daily quota of 300 (stated by the service)" in str(error)
    assert [r.status for r in rows].count("ok") == service.admitted[KEYS[0]] == 20
    assert service.refused == 0 and lane.rate_limited == 0


@pytest.mark.slow
def test_two_runs_on_a_key_with_a_stated_quota_stop_at_its_last_answer_with_no_429():
    """Two runs on one key and budget: each answer's room counts what both spent, so together they
    send the quota and stop, neither refused."""
    service = DailyQuota(600, 300, stated=True)

    async def main():
        loop = asyncio.get_running_loop()
        budget = ProcessBudget(loop.time, shared=True)

        async def one(seed: int):
            client = batchsum.AsyncClient(KEYS[0], "http://127.0.0.1:9", transport=httpx.MockTransport(service))
            lane = KeyLane(client, Pacer(600, budget=budget), budget=budget)
            rows, error = [], None
            try:
                async for row in summarize_stream(texts(1000, seed), client, lanes=[lane]):
                    rows.append(row)
            except QuotaSpent as exc:
                error = exc
            finally:
                await client.aclose()
            return [r.status for r in rows].count("ok"), error

        return await asyncio.gather(one(1), one(2))

    (ok1, error1), (ok2, error2) = virtual_clock.run(main())
    assert ok1 + ok2 == service.admitted[KEYS[0]] == 300 and error1 is not None and error2 is not None
    assert service.refused == 0


class TeamDailyQuota(KeyedService):
    """Each key at ``rpm`` with a daily quota of ``quota``, stated in the list form in every answer."""

    def __init__(self, keys: list[str], rpm: int, quota: int):
        super().__init__(dict.fromkeys(keys, rpm))
        self.quota, self.used = quota, dict.fromkeys(keys, 0)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        key = request.headers["authorization"].removeprefix("Bearer ")
        if self.used[key] >= self.quota:
            self.refused += 1
            response = httpx.Response(429, json={"error": Messages.RATE_LIMITED}, headers={"Retry-After": "86400"})
        else:
            self.used[key] += 1
            response = await super().__call__(request)
        response.headers.update(
            {
                "RateLimit-Limit": f"{self.quota}, {self.rpm[key]};w=60, {self.quota};w=86400",
                "RateLimit-Remaining": str(self.quota - self.used[key]),
                "RateLimit-Reset": "86400",
            }
        )
        return response


@pytest.mark.parametrize("rpm", [6, 120, 600])
def test_several_keys_whose_stated_quotas_are_spent_stop_the_run_at_their_last_answers(rpm):
    """The 200 that says none is left takes its key out: no request of the key is admitted again to
    find it spent, so without it a run of several keys waited a day for the reset."""
    keys = team_keys(3)
    service = TeamDailyQuota(keys, rpm, 5)

    async def main():
        loop = asyncio.get_running_loop()
        clients, lanes = [], []
        for key in keys:
            budget = ProcessBudget(loop.time, shared=True)
            clients.append(batchsum.AsyncClient(key, "http://127.0.0.1:9", transport=httpx.MockTransport(service)))
            lanes.append(KeyLane(clients[-1], Pacer(rpm, budget=budget), budget=budget))
        rows, error = [], None
        try:
            async for row in summarize_stream(texts(40), clients[0], lanes=lanes, max_wait=1800):
                rows.append(row)
        except QuotaSpent as exc:
            error = exc
        finally:
            for client in clients:
                await client.aclose()
        return rows, error, loop.time()

    rows, error, wall = virtual_clock.run(main())
    assert error is not None and error.remaining == 25 and "daily quota of 5 (stated by the service)" in str(error)
    assert [r.status for r in rows].count("ok") == 15 and service.refused == 0
    assert wall < 3600  # virtual seconds: stopped at the last answer, not at the quotas' reset a day away


class Renewing(DailyQuota):
    """A quota of an hour whose 429s ask for 600 s, renewed 700 s after it was first spent."""

    renewing = False

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.used >= self.quota and not self.renewing:
            self.renewing = True
            asyncio.get_running_loop().call_later(700, self.renew)
        return await super().__call__(request)

    def renew(self) -> None:
        self.used = 0


@pytest.mark.slow
def test_a_quota_that_resets_within_max_wait_is_waited_for_and_the_run_finishes():
    service = Renewing(600, 100, stated=False, retry_after=600)
    rows, error, lane, wall = run_quota(service, 150, max_wait=1800)
    assert error is None and [r.status for r in rows] == ["ok"] * 150
    assert wall >= 600  # waited for the reset (virtual seconds)
    assert service.refused <= 3


@pytest.mark.parametrize(("retry_after", "max_wait"), [(600, 300), (90, 30)])
def test_a_429_asking_for_longer_than_max_wait_is_the_same_stop_not_a_wait(retry_after, max_wait):
    """A quota's 429 (600 s), or a Retry-After of a minute and a half with ``max_wait`` 30: the run
    stops at once, rows kept; only a quota is remembered."""
    service = Renewing(600, 100, stated=False, retry_after=retry_after)
    record = record_of()
    rows, error, lane, wall = run_quota(service, 150, max_wait=max_wait, record=record)
    assert error is not None and [r.status for r in rows].count("ok") == 100
    assert [r.error for r in rows if r.status != "ok"] == ["not_sent"] * 50
    assert wall < 60 and service.refused <= 3
    assert (QUOTA_SPENT in told(record)) == (retry_after > 120)


class Refusing:
    """Every request answered 429 asking to wait ``retry_after`` seconds (no other header)."""

    def __init__(self, retry_after: int) -> None:
        self.retry_after = retry_after
        self.calls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        return httpx.Response(
            429, json={"error": Messages.RATE_LIMITED}, headers={"Retry-After": str(self.retry_after)}
        )


def run_refused(service, keys: int, n: int, max_wait: float):
    """``n`` texts on ``keys`` keys, each on its budget; (rows, the error the run stopped with), or
    ("still running", None) when the run has not ended after a day of virtual time."""

    async def main():
        loop = asyncio.get_running_loop()
        clients, lanes = [], []
        for key in team_keys(keys):
            budget = ProcessBudget(loop.time, shared=True)
            clients.append(batchsum.AsyncClient(key, "http://127.0.0.1:9", transport=httpx.MockTransport(service)))
            lanes.append(KeyLane(clients[-1], Pacer(600, budget=budget), budget=budget))
        rows, error = [], None

        async def go():
            async for row in summarize_stream(texts(n), clients[0], lanes=lanes, max_wait=max_wait):
                rows.append(row)

        try:
            await asyncio.wait_for(go(), 86_400)
        except QuotaSpent as exc:
            error = exc
        except asyncio.TimeoutError:
            return "still running", None
        finally:
            for client in clients:
                await client.aclose()
        return rows, error

    return virtual_clock.run(main())


@pytest.mark.parametrize("keys", [1, 2])
def test_max_wait_ends_a_rows_429s_that_take_its_key_out_and_back(keys):
    """429s asking for 130 s (longer than a per-minute "later": the key leaves the run until then),
    with ``max_wait`` 600: each time the key is back the row is refused again; it fails
    ``rate_limited`` once it has been refused for ``max_wait`` since its first 429, on whichever key."""
    service = Refusing(130)
    rows, error = run_refused(service, keys, 2, max_wait=600)
    assert rows != "still running" and error is None
    assert [(r.status, r.error) for r in rows] == [("failed", "rate_limited")] * 2
    assert service.calls <= 2 * keys * (600 // 130 + 2)


class SkewedMinute:
    """A limit of ``limit`` a clock-aligned minute stating ``X-RateLimit-Limit/-Remaining/-Reset``, the
    reset as a Unix time on a clock ``skew`` seconds ahead: a minute's reset that reads as up to 66 s."""

    def __init__(self, limit: int, skew: float) -> None:
        self.limit, self.skew = limit, skew
        self.used: dict[int, int] = {}
        self.refused = self.admitted = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        now = asyncio.get_running_loop().time()
        minute = int(now // 60)
        self.used[minute] = self.used.get(minute, 0) + 1
        end = (minute + 1) * 60
        headers = {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(max(0, self.limit - self.used[minute])),
            "X-RateLimit-Reset": str(int(time.time() + (end - now) + self.skew)),
        }
        await asyncio.sleep(0.3)
        if self.used[minute] > self.limit:
            self.refused += 1
            retry_after = str(math.ceil(end - now))
            return httpx.Response(
                429, json={"error": Messages.RATE_LIMITED}, headers={"Retry-After": retry_after, **headers}
            )
        self.admitted += 1
        return httpx.Response(200, json={contract.FIELD_RESULT: "A summary."}, headers=headers)


def test_a_quota_that_resets_within_two_minutes_is_a_pause_never_a_stop_nor_remembered():
    """A per-minute limit whose reset, a Unix time on a clock 6 s ahead, reads as over a minute: its
    limit reads as a quota (issue 40's rule), but one that resets within two minutes only pauses the
    key. The run finishes with ``max_wait`` 30, and the key's record hears of no quota."""
    service = SkewedMinute(30, skew=6)
    record = record_of()
    rows, error, lane, _ = run_quota(service, 100, max_wait=30, record=record, rpm=30)
    assert error is None and [r.status for r in rows] == ["ok"] * 100
    assert lane.spent is None and service.refused <= 3
    assert not told(record) & {QUOTA, QUOTA_SPENT}


def test_a_configured_quota_is_counted_on_the_keys_budget_by_every_run_on_it():
    """Two runs on one key, one budget: together they send at most the quota, in requests paid."""
    service = KeyedService({KEYS[0]: 600})
    quota = Quota(120, "day")

    async def main():
        loop = asyncio.get_running_loop()
        budget = ProcessBudget(loop.time, shared=True)
        client = batchsum.AsyncClient(KEYS[0], "http://127.0.0.1:9", transport=httpx.MockTransport(service))

        async def one(run: int):
            lane = KeyLane(client, Pacer(600, budget=budget), quota=quota, budget=budget)
            rows, error = [], None
            try:
                async for row in summarize_stream(texts(100, run), client, lanes=[lane]):
                    rows.append(row)
            except QuotaSpent as exc:
                error = exc
            return rows, error

        try:
            return await asyncio.gather(one(0), one(1)), await budget.quota_used(quota.window(time.time())[0])
        finally:
            await client.aclose()

    ((rows1, error1), (rows2, error2)), used = virtual_clock.run(main())
    ok = [r.status for r in rows1 + rows2].count("ok")
    assert ok == service.admitted[KEYS[0]] == used == 120 and service.refused == 0
    stopped = [error for error in (error1, error2) if error is not None]
    assert stopped and all("daily quota of 120 (configured)" in str(error) for error in stopped)
    assert sum(error.remaining for error in stopped) == 200 - 120


@pytest.mark.parametrize("rpm", [60, 600])
def test_batches_of_one_run_on_a_key_spend_a_configured_quota_whole(rpm):
    """Issue 52: four batches of one run on one key at once (DuckDB's threads: one lane, its pacer and
    its count), 15 texts each, a daily quota of 30: the service admits 30. A batch refused by the
    quota judged the key spent from its own claims alone, while the others' waited for their turns;
    out of the run, those were given back unsent (3 of 30 admitted at 60/min)."""
    service = KeyedService({KEYS[0]: rpm})
    quota = Quota(30, "day")

    async def main():
        loop = asyncio.get_running_loop()
        budget = ProcessBudget(loop.time, shared=True)
        client = batchsum.AsyncClient(KEYS[0], "http://127.0.0.1:9", transport=httpx.MockTransport(service))
        lane = KeyLane(client, Pacer(rpm, budget=budget), quota=quota, budget=budget)

        async def batch(part: int) -> list[str]:
            rows = []
            try:
                async for row in summarize_stream(texts(15, part), client, lanes=[lane]):
                    rows.append(row.status)
            except QuotaSpent:
                pass
            return rows

        try:
            done = await asyncio.gather(*(batch(part) for part in range(4)))
            return done, await budget.quota_used(quota.window(time.time())[0])
        finally:
            await client.aclose()

    done, used = virtual_clock.run(main())
    ok = sum(rows.count("ok") for rows in done)
    assert ok == service.admitted[KEYS[0]] == used == 30 and service.refused == 0


@pytest.mark.parametrize("keys", [1, 2])
def test_a_run_waiting_on_spent_quotas_says_so_once_then_shows_it(keys):
    """Issue 52: a run of 30 texts whose keys' hourly quotas of 5 are spent after 5 (``max_wait``
    beyond the reset) said that it waits once per attempt that had claimed when the quotas ran out
    (3 to 7 times). On the virtual clock, 30 s of the wait cost no test time: each key's line that
    it leaves the run and the run's line that it waits are said once, and the wait is on the stats
    (the bar's line and the run's entry read it) until a key sends again."""
    from batchsum.app.run_view import describe_progress

    service = KeyedService({key: 600 for key in team_keys(keys)})
    quota = Quota(5, "hour")
    told: list[str] = []

    async def main():
        loop = asyncio.get_running_loop()
        lanes, clients = [], []
        for key in team_keys(keys):
            budget = ProcessBudget(loop.time, shared=True)
            client = batchsum.AsyncClient(key, "http://127.0.0.1:9", transport=httpx.MockTransport(service))
            lane = KeyLane(client, Pacer(600, budget=budget), quota=quota, budget=budget, tell=told.append)
            lanes.append(lane)
            clients.append(client)
        stats = BatchStats(total=30)
        rows = []

        async def consume():
            async for row in summarize_stream(texts(30), clients[0], lanes=lanes, stats=stats, max_wait=7200):
                rows.append(row)

        try:
            await asyncio.wait_for(consume(), 30.0 + 5)  # 30 s of the wait, after the 5 a key sends
        except asyncio.TimeoutError:
            pass
        waiting = (stats.waiting, ProgressBar.describe(stats), describe_progress(stats))
        for client in clients:
            await client.aclose()
        return rows, waiting

    rows, waiting = virtual_clock.run(main())
    assert sum(service.admitted[key] for key in team_keys(keys)) == 5 * keys and service.refused == 0
    assert len(rows) <= 5 * keys  # in input order: those before the first row left unsent
    assert sum("it leaves the run until then" in line for line in told) == keys, told
    assert sum("quota spent; the run waits for the hourly quota of 5 (configured)" in line for line in told) == 1, told
    waits, bar, app = waiting
    assert waits is not None and waits.startswith("waits for the hourly quota of 5 (configured)")
    assert f"429s 0 · {waits} · " in bar and waits in app  # the bar's line, the apps' state line


class SlowGiveBack(ProcessBudget):
    """A budget whose give-back takes a second to answer, as a Redis across a network may."""

    async def quota_give_back(self, periods) -> None:
        await asyncio.sleep(1.0)
        await super().quota_give_back(periods)


def test_a_429s_give_back_of_a_configured_quota_is_done_before_the_run_ends():
    """The run's last requests are refused 429 (not paid): their counts are given back on the key's
    budget before the run returns, not left to a task the budget's close may cut off."""
    service = KeyedService({KEYS[0]: 600})
    service.limits[KEYS[0]] = SlidingWindow(30, 60.0)  # the plan says 600; the service admits 30
    quota = Quota(1000, "day")
    rows, _, lane, _ = run_quota(service, 40, max_wait=0, quota=quota, budget_type=SlowGiveBack)
    used = asyncio.run(lane.budget.quota_used(quota.window(time.time())[0]))
    assert service.refused > 0  # some were refused, and their counts given back
    assert used == service.admitted[KEYS[0]] == [r.status for r in rows].count("ok")


# -- the counts on every kind of budget ------------------------------------------------------------------


DAY, HOUR, MONTH = ("day:2026-11-26", 3600.0), ("hour:2026-11-26T10", 60.0), ("month:2026-11", 3600.0)


def test_quota_counts_hold_their_limit_across_connections_and_count_every_period(users):
    """Two connections (as two processes) on the key's budget, on every kind: a claim counts in
    each period given and is refused when the first holds the limit; a claim with no limit (a run
    that set no quota) counts all the same; a give-back uncounts every period."""
    one, two = users(), users()

    async def main():
        got = [await (one if i % 2 else two).quota_claim([DAY, HOUR, MONTH], 5) for i in range(7)]
        unbounded = await one.quota_claim([HOUR, DAY, MONTH], None)  # a run with no quota: counted
        await one.quota_give_back([DAY[0], HOUR[0], MONTH[0]])
        again = await two.quota_claim([DAY, HOUR, MONTH], 5)
        other = await one.quota_claim([("day:2026-11-27", 3600.0)], 5)
        used = [await two.quota_used(name) for name in (DAY[0], HOUR[0], MONTH[0])]
        await one.aclose()
        await two.aclose()
        return got, unbounded, again, other, used

    got, unbounded, again, other, used = asyncio.run(main())
    assert [(c.counts[0] if c.counted else None) for c in got] == [1, 2, 3, 4, 5, None, None]
    assert got[4].counts == (5, 5, 5) and got[5].counts == (5, 5, 5)  # a refusal counts nothing, and says each
    assert unbounded.counted and unbounded.counts == (6, 6, 6)  # past the day's limit: a run with no quota
    assert not again.counted and again.counts == (5, 5, 5)  # the day holds 5 again after the give-back: spent
    assert other.counts == (1,) and used == [5, 5, 5]


@pytest.mark.parametrize(
    ("quota", "at", "period", "end"),
    [
        ("10/hour", "2026-11-26T10:59:59", "hour:2026-11-26T10", "2026-11-26T11:00:00"),
        ("10/day", "2026-12-31T23:30:00", "day:2026-12-31", "2027-01-01T00:00:00"),
        ("10/month", "2028-02-10T00:00:00", "month:2028-02", "2028-03-01T00:00:00"),
        ("10/month", "2026-12-31T23:59:59", "month:2026-12", "2027-01-01T00:00:00"),
    ],
)
def test_a_configured_quota_counts_in_utc_calendar_periods(quota, at, period, end):
    def unix(text: str) -> float:
        return _dt.datetime.fromisoformat(text).replace(tzinfo=_dt.timezone.utc).timestamp()

    name, start, stop = parse_quota(quota).window(unix(at))
    assert name == period and stop == unix(end) and start <= unix(at) < stop


def test_the_stated_quota_counts_our_starts_the_service_may_not_have_counted_yet():
    quota = StatedQuota(wall=lambda: 1000.0)
    for t in (0.0, 1.0, 2.0, 3.0):
        quota.started(t)
    quota.stated(5, 100.0, 300, 86400.0, at=1.0, now=3.5)  # the answer to the start at 1: 2 and 3 may be uncounted
    assert quota.left == 3 and quota.allows(3.5) and not quota.allows(3.5, reserved=3)
    quota.stated(4, 100.0, 300, 86400.0, at=0.0, now=3.6)  # an older answer arriving late: it says less
    assert quota.left == 3
    assert quota.describe() == "about 3 left in the daily quota of 300 until 1970-01-01 00:18 UTC"


def test_the_stated_quota_keeps_the_latest_started_attempts_figure_so_others_spending_counts():
    """Another process on the key spent 4 since: the answer to our latest start says so, and the
    figure it leaves is kept, smaller or not; a ``Remaining: 0`` on a 200 spends the quota."""
    quota = StatedQuota(wall=lambda: 1000.0)
    for t in (0.0, 1.0, 2.0):
        quota.started(t)
    quota.stated(10, 100.0, 300, 86400.0, at=0.0, now=0.5)
    assert quota.left == 8  # our starts at 1 and 2 may be uncounted
    quota.stated(4, 100.0, 300, 86400.0, at=1.0, now=1.5)  # 10 - 1 (ours) - 4 (another process's) - 1
    assert quota.left == 3 and quota.allows(1.5)
    quota.stated(0, 100.0, 300, 86400.0, at=2.0, now=2.5)  # a 200 whose Remaining is 0
    assert quota.left == 0 and not quota.allows(2.5)
    quota.stated(7, 100.0, 300, 86400.0, at=1.5, now=2.6)  # an earlier attempt's figure, arriving late
    assert quota.left == 0 and not quota.allows(2.6)
    assert quota.allows(103.0)  # its reset: a new period


class FarBudget(ProcessBudget):
    """A budget whose every count takes 30 ms to answer, as a Redis across regions may."""

    async def quota_claim(self, periods, limit, epoch=None):
        await asyncio.sleep(0.03)
        return await super().quota_claim(periods, limit, epoch)


def test_counting_on_a_far_budget_does_not_slow_the_pace():
    """Every run counts what it pays on the key's budget, a call per request; on a budget 30 ms
    away, a run at 6000/min still starts at its pace (one count at a time held it near 2000/min).
    On the virtual clock: the time is the pacer's, exact."""
    service = KeyedService({KEYS[0]: 6000})
    rows, _, lane, _ = run_quota(service, 600, max_wait=0, budget_type=FarBudget)
    counted = asyncio.run(lane.budget.quota_used(period_window("day", time.time())[0]))
    after_first = service.arrivals[KEYS[0]][1:]  # the key's first request goes alone, by design
    assert counted == 600 and all(row.status == "ok" for row in rows)
    assert (len(after_first) - 1) / (after_first[-1] - after_first[0]) * 60 >= 0.95 * 6000


# -- a budget that comes back empty: what its runs counted is restored ----------------------------------


class Emptied:
    """A budget runs share (``kind``: a SQLite file, or a real redis-server) and how it comes back
    empty: the file removed with its log (as a person clearing the cache folder does), or Redis
    flushed (as a restart without persistence does)."""

    def __init__(self, kind: str, tmp_path, redis_url: str | None) -> None:
        self.kind, self.path, self.url = kind, tmp_path / "budget.sqlite", redis_url
        self.identity = uuid.uuid4().hex
        self.location = f"sqlite://{self.path}" if kind == "sqlite" else str(redis_url)

    def user(self) -> Budget:
        """Another connection to it (as another process has)."""
        if self.kind == "sqlite":
            return SQLiteBudget(self.path, self.identity)
        return RedisBudget(str(self.url), self.identity)

    def empty(self) -> None:
        if self.kind == "sqlite":
            for made in self.path.parent.glob(self.path.name + "*"):
                made.unlink()
        else:
            import redis

            redis.Redis.from_url(str(self.url)).flushall()


@pytest.fixture(params=["sqlite", "redis"])
def emptied(request, tmp_path):
    return Emptied(request.param, tmp_path, request.getfixturevalue("redis_url") if request.param == "redis" else None)


MID_HOUR = math.floor(time.time() / 3600) * 3600 + 1800.0  # the periods' clock: no hour ends mid-test


@pytest.mark.parametrize("survivors", [0, 1, 2])
@pytest.mark.parametrize("path", ["claiming", "waiting"])
def test_an_emptied_budget_gets_back_every_period_of_what_its_surviving_runs_saw_counted_once(emptied, path, survivors):
    """Run A paid 6 of a quota of 10 an hour, then run C 3 (it saw 9 counted); the budget comes back
    empty and a new run B counts one before anyone restores. Each surviving run restores what it saw,
    every period (the hour, the day, the month), added to B's, and the old epoch's count once (the
    most any run saw): through its next claim, or, waiting, as soon as a call of its hears the new
    epoch (the entry's keep-alive look). With no survivor, nobody remembers: B's count is all there is."""
    quota = Quota(10, "hour")

    def run() -> CountedQuota:
        return CountedQuota(quota, emptied.user(), wall=lambda: MID_HOUR)

    async def main():
        a, c, b = run(), run(), run()
        for who, times in ((a, 6), (c, 3)):
            for _ in range(times):
                who.settle(await who.claim(), paid=True)
        emptied.empty()
        assert await b.claim() is not None  # counted on the new epoch before any restore: it stays
        for who in {0: [], 1: [a], 2: [c, a]}[survivors]:  # with two, the one that saw more first
            if path == "claiming":
                await who.claim()  # restored first, then counted if the hour has room
            else:
                who.seen.heard((await who.budget.reserve(0.0, start=False)).epoch)  # the keep-alive's look
                await who.close()  # the restore it began at once
        names = [name for name, _ in b._periods()]
        counts = [await b.budget.quota_used(name) for name in names]
        for who in (a, b, c):
            await who.close()
            await who.budget.aclose()
        return counts

    counts = asyncio.run(main())
    # A alone: B's 1 and the 6 A saw (and A's claim after: 8); A and C: B's 1 and the 9 C saw, once
    # (their claims refused on the 10 restored).
    expected = {0: 1, 1: 1 + 6 + (path == "claiming"), 2: 1 + 9}[survivors]
    assert counts == [expected] * 3, (path, survivors, counts)


# -- through the command line: a run waiting on a spent quota, its budget emptied -----------------------


class Said:
    """A process's stderr, read as it comes on a thread of its own (its lines kept)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._reader.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stderr is not None
        for line in process.stderr:
            self.lines.append(line)

    def count(self, words: str) -> int:
        return sum(words in line for line in list(self.lines))

    def ended(self) -> str:
        self._reader.join(60)
        return "".join(self.lines)


def waits_for(condition, what: str, seconds: float = 120.0):
    """``condition()``, once true (a guard of ``seconds`` against a hang, not a timing)."""
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)
    return found


def hour_now() -> str:
    return period_window("hour", time.time())[0]


WAITS = "quota spent; the run waits for the hourly quota of 10 (configured)"


@pytest.mark.heavy
def test_a_run_waiting_on_a_spent_quota_restores_it_to_a_budget_back_empty_and_says_its_wait_once(
    emptied, svc, tmp_path
):
    """Issue 52, through ``batchsum summarize``: run A (``--quota 10/hour --max-wait 7200``) sends 10
    and waits for the hour's reset, saying so once, then on its bar and in ``batchsum top``. The
    budget comes back empty (Redis flushed; the SQLite file removed): A, whose pacer is quiet, hears
    it on its entry's keep-alive and restores what it saw counted, every period, before any claim.
    Then run B (``--quota 10/hour``) sends 0, a run with ``--quota 12/day`` sends 2 (the day holds A's
    10), and a later ``--quota 10/hour`` run 0: the service admitted 12 in the hour, never 20. A waits
    through all of it, having said its wait once (its repeats came in the wait's first moments, one
    per attempt that had claimed when the quota ran out: the run's entry shows the wait within a
    keep-alive, 5 s, by which time every such attempt has been refused). An hour that turns during
    the scenario spoils it (A's quota resets): it is run again."""
    from batchsum import Client

    with Client(api_key=PREMIUM, base_url=svc.url) as client:
        emptied.identity = client.identity
    for attempt in range(2):
        hour = hour_now()
        outcome = _waiting_run_and_an_emptied_budget(emptied, svc, tmp_path / f"try{attempt}")
        if hour_now() == hour:
            break
    sent, lines, waiting = outcome
    assert sent == {"A": 10, "B": 0, "a day's 12": 2, "an hour's 10": 0}, sent
    assert sum(WAITS in line for line in lines) == 1, lines
    assert sum("it leaves the run until then" in line for line in lines) == 1, lines
    assert sum("counts this run saw there are restored" in line for line in lines) == 1, lines
    assert waiting.startswith("waits for the hourly quota of 10 (configured) to reset at "), waiting


def _waiting_run_and_an_emptied_budget(emptied: Emptied, svc, folder):
    """The scenario once, in ``folder``: what each run sent (at the service), A's lines, and what
    ``batchsum top`` showed A waiting for."""
    folder.mkdir()
    svc.state.reset_stats()
    emptied.empty()
    env = {
        **os.environ,
        "BATCHSUM_API_KEY": PREMIUM,
        "BATCHSUM_BASE_URL": svc.url,
        "BATCHSUM_BUDGET": emptied.location,
        "BATCHSUM_RPM": "600",
        "XDG_CACHE_HOME": str(folder / "cache"),
        "PYTHONPATH": str(ROOT),
    }

    def summarize(name: str, seed: int, texts: int, *flags: str) -> list[str]:
        pq.write_table(pa.table({"text": [article(20, seed=seed * 1000 + i) for i in range(texts)]}), folder / name)
        return [sys.executable, "-m", "batchsum", "summarize", name, "-o", f"out-{name}", "--column", "text", *flags]

    def requests() -> int:
        return int(svc.stats()["requests"])

    a = subprocess.Popen(
        summarize("a.parquet", 1, 15, "--quota", "10/hour", "--max-wait", "7200"),
        env=env, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    said, sent = Said(a), {}
    try:
        waits_for(lambda: said.count(WAITS), "A's wait")
        sent["A"] = requests()

        def top_shows_a_waiting() -> str | None:
            done = subprocess.run(
                [sys.executable, "-m", "batchsum", "top", "--once", "--json"], env=env, cwd=folder,
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            keys = json.loads(done.stdout)["keys"] if done.returncode == 0 else []
            return next((run["waiting"] for key in keys for run in key["runs"] if run.get("waiting")), None)

        waiting = waits_for(top_shows_a_waiting, "A's wait in top")
        emptied.empty()
        hour = period_window("hour", time.time())[0]

        async def counted() -> int:
            budget = emptied.user()
            try:
                return await budget.quota_used(hour)
            finally:
                await budget.aclose()

        waits_for(lambda: asyncio.run(counted()) >= 10, "A's counts restored")  # A's keep-alive heard it
        for name, seed, quota in (("B", 2, "10/hour"), ("a day's 12", 3, "12/day"), ("an hour's 10", 4, "10/hour")):
            before = requests()
            done = subprocess.run(
                summarize(f"{seed}.parquet", seed, 10, "--quota", quota, "--max-wait", "5"),
                env=env, cwd=folder, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert done.returncode == 1 and "quota" in done.stderr, done.stderr
            sent[name] = requests() - before
        a.send_signal(signal.SIGINT)
        assert a.wait(120) == 130
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    said.ended()
    assert requests() == sum(sent.values())  # A sent nothing more while it waited
    return sent, said.lines, waiting
