"""The dry run says what the run then does (issue 48): each key read as a dry run reads it
(``run.preview.look_at_key``: its rate, its quotas, a quota its record knows spent), the job projected
(``pacing.look.forecast.project``), then the same job run on the same budget and record, on virtual time
with a wall clock that moves with it. A quota whose reset comes within ``max_wait`` is a wait with
its end (the time counts it); beyond it, a stop; a key whose quota is spent adds nothing to the rate."""

from __future__ import annotations

import asyncio
import datetime as _dt
import math
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import batchsum
from batchsum.engine import summarize_stream
from batchsum.engine.lanes import KeyLane
from batchsum.errors import QuotaSpent
from batchsum.options import RunSpec
from batchsum.pacing import KeyRecord, Pacer
from batchsum.pacing.budgets.budget import ProcessBudget
from batchsum.pacing.budgets.exchange import Remembered, Share
from batchsum.pacing.budgets.quota import CountedQuota, Spent, StatedQuota
from batchsum.pacing.look.forecast import QuotaLeft, first_back, key_now, project
from batchsum.run.preview import look_at_key
from batchsum.service.key_plans import KeyPlan
from tests import virtual_clock
from tests.engine.test_keys import KeyedService
from tests.engine.test_keys import keys as team_keys

URL = "http://127.0.0.1:9"
A_QUARTER_TO_TWO = _dt.datetime(2030, 1, 15, 13, 45, tzinfo=_dt.timezone.utc).timestamp()
HOUR = 3600.0


def texts(n: int, seed: int = 0) -> list[str]:
    return [f"Forecast text {seed}-{i} has enough words in it to be worth a summary of its own." for i in range(n)]


class Recalling(ProcessBudget):
    """The key's budget on the loop's clock, remembering what runs tell it (in memory, stamped by
    ``wall``), as the machine's budget does in its file."""

    def __init__(self, clock, wall) -> None:
        super().__init__(clock, shared=True)
        self.wall = wall
        self.entries: dict[tuple[str, str, str], Remembered] = {}

    async def remember(self, key_hash: str, service: str, entries: dict[str, str]) -> None:
        for name, value in entries.items():
            self.entries[key_hash, service, name] = Remembered(key_hash, service, name, value, self.wall())

    async def recall(self, key_hash: str, service: str) -> list[Remembered]:
        return [entry for (key, svc, _), entry in self.entries.items() if (key, svc) == (key_hash, service)]


class Job:
    """One job on virtual time: its keys (``plans``) each on its budget, the wall clock at the loop's
    start ``wall0``; ``look`` reads the keys as a dry run does and projects the job, ``run`` runs it."""

    def __init__(self, spec: RunSpec, service: KeyedService, wall0: float) -> None:
        self.spec, self.service, self.wall0 = spec, service, wall0
        self.loop = asyncio.get_running_loop()
        self.budgets = {plan.hash: Recalling(self.loop.time, self.wall) for plan in spec.keys}
        self.told: list[str] = []  # the lines the run says of its keys

    def wall(self) -> float:
        return self.wall0 + self.loop.time()

    async def spend(self, plan: KeyPlan, count: int) -> None:
        """``count`` requests paid earlier on the key's configured quota (another run's)."""
        counted = CountedQuota(plan.quota, self.budgets[plan.hash], wall=self.wall)
        for _ in range(count):
            assert await counted.claim() is not None

    async def remember_spent(self, plan: KeyPlan, name: str, until: float) -> None:
        """The key's record knows a quota spent until ``until`` (an earlier run saw it)."""
        record = await self.record(plan)
        record.spent(Spent(name, until))
        await record.flush()

    async def record(self, plan: KeyPlan) -> KeyRecord:
        budget, service = self.budgets[plan.hash], self.spec.client.service
        return KeyRecord(budget, plan.hash, service, await budget.recall(plan.hash, service), clock=self.wall)

    async def look(self, requests: int):
        looks = [await look_at_key(self.spec, plan, self.budgets[plan.hash], self.wall) for plan in self.spec.keys]
        return project([look.now for look in looks], requests, self.wall(), self.spec.max_wait)

    async def run(self, n: int):
        """(rows, the error the run stopped with, its lanes, virtual seconds it took)."""
        start, lanes, clients = self.loop.time(), [], []
        for plan in self.spec.keys:
            budget = self.budgets[plan.hash]
            client = batchsum.AsyncClient(plan.key.reveal(), URL, transport=httpx.MockTransport(self.service))
            clients.append(client)
            rpm, _ = plan.limit(self.spec.rpm, self.spec.auto)
            quota = plan.quota or self.spec.quota
            share = Share("job", self.spec.share) if self.spec.share < 1 else None
            lanes.append(
                KeyLane(
                    client, Pacer(rpm, budget=budget, share=share), await self.record(plan), plan.hash, plan.source, quota, budget,
                    counted=CountedQuota(quota, budget, wall=self.wall), stated=StatedQuota(wall=self.wall),
                    tell=self.told.append,
                )
            )  # fmt: skip
        rows, error = [], None
        try:
            async for row in summarize_stream(texts(n), clients[0], lanes=lanes, max_wait=self.spec.max_wait):
                rows.append(row)
        except QuotaSpent as exc:
            error = exc
        finally:
            for client in clients:
                await client.aclose()
        return rows, error, lanes, self.loop.time() - start


def spec_of(keys: list[str], tmp_path: Path, lines: list[str], max_wait: float, **options) -> RunSpec:
    """A spec over a key file of ``lines`` (each ``KEY RATE [quota=...]``, the key put in by index)."""
    path = tmp_path / "keys.txt"
    path.write_text("".join(line.format(*keys) + "\n" for line in lines))
    path.chmod(0o600)
    return RunSpec.from_kwargs(keys=path, base_url=URL, max_wait=max_wait, progress=False, **options)


def run_job(spec: RunSpec, service: KeyedService, wall0: float, n: int, before=None, told=None):
    """The dry run's projection of ``n`` requests, then the run: (projection, rows, error, lanes,
    seconds); ``told`` gets the lines the run said of its keys."""

    async def main():
        job = Job(spec, service, wall0)
        if before is not None:
            await before(job)
        projection = await job.look(n)
        rows, error, lanes, seconds = await job.run(n)
        if told is not None:
            told.extend(job.told)
        return projection, rows, error, lanes, seconds

    return virtual_clock.run(main())


def assert_same(projection, rows, error, seconds, wall0: float) -> None:
    """The run did what the projection said: as many sent, stopped or not, and (from the same start)
    in the same time, within a second's latency and the pace's margin."""
    ok = [r.status for r in rows].count("ok")
    assert ok == projection.sent, (ok, projection)
    assert (error is not None) == projection.stops, (error, projection)
    if projection.stops:
        assert [r.error for r in rows if r.status != "ok"] == ["not_sent"] * (len(rows) - ok)
        assert error.remaining == projection.requests - projection.sent
    else:
        assert seconds >= projection.waited  # every wait the projection says, the run waited
        assert abs(seconds - projection.seconds) <= 2.0 + 0.02 * (projection.seconds - projection.waited)


# -- a configured hourly quota: the 40/hour at 13:45 ------------------------------------------


def test_a_quota_that_resets_within_max_wait_is_a_wait_until_its_reset_and_the_run_finishes(tmp_path):
    """``--quota 40/hour`` at 13:45 UTC, 70 texts, ``max_wait`` 1800: the dry run says 40, a wait
    for 14:00, then the other 30, about 15 minutes in all; the run does exactly that (it said "send
    about 40 and stop" before)."""
    [key] = team_keys(1)
    spec = spec_of([key], tmp_path, ["{0} 600 quota=40/hour"], max_wait=1800)
    service, told = KeyedService({key: 600}), []
    projection, rows, error, lanes, seconds = run_job(spec, service, A_QUARTER_TO_TWO, 70, told=told)
    assert not projection.stops and projection.sent == 70 and projection.rate == 600
    [wait] = projection.waits
    assert (wait.sent, wait.until - A_QUARTER_TO_TWO) == (40, 15 * 60) and "hourly quota of 40" in wait.why
    assert [r.status for r in rows] == ["ok"] * 70 and error is None
    arrivals = service.arrivals[key]
    assert arrivals[40] >= 15 * 60 - 1e-6 > arrivals[39]  # the 41st went once the hour turned, not before
    waited = [line for line in told if "the run waits" in line]  # said once, with the reset's time
    assert len(waited) == 1 and "hourly quota of 40 (configured) to reset at 2030-01-15 14:00 UTC" in waited[0]
    assert_same(projection, rows, error, seconds, A_QUARTER_TO_TWO)


def test_a_quota_that_resets_beyond_max_wait_stops_the_run_where_the_dry_run_says(tmp_path):
    [key] = team_keys(1)
    spec = spec_of([key], tmp_path, ["{0} 600 quota=40/hour"], max_wait=300)
    service = KeyedService({key: 600})
    projection, rows, error, lanes, seconds = run_job(spec, service, A_QUARTER_TO_TWO, 70)
    assert projection.stops and projection.sent == 40 and projection.back - projection.stop_at > 300
    assert service.admitted[key] == 40 and "hourly quota of 40 (configured)" in str(error)
    assert_same(projection, rows, error, seconds, A_QUARTER_TO_TWO)


@pytest.mark.parametrize(("max_wait", "stops"), [(7200, False), (60, True)])
def test_a_quota_spent_earlier_in_the_hour_waits_from_the_start_with_a_long_max_wait(tmp_path, max_wait, stops):
    """The hour's 40 were paid by an earlier run: with ``max_wait`` 7200 the dry run says the run
    waits until 14:00 and then sends; with a short one, that it sends nothing and stops."""
    [key] = team_keys(1)
    spec = spec_of([key], tmp_path, ["{0} 600 quota=40/hour"], max_wait=max_wait)
    service = KeyedService({key: 600})

    async def spent(job: Job) -> None:
        await job.spend(spec.keys[0], 40)

    projection, rows, error, lanes, seconds = run_job(spec, service, A_QUARTER_TO_TWO, 30, before=spent)
    assert projection.stops == stops and projection.sent == (0 if stops else 30)
    if not stops:
        assert [(w.sent, w.until - A_QUARTER_TO_TWO) for w in projection.waits] == [(0, 15 * 60)]
        assert min(service.arrivals[key]) >= 15 * 60 - 1e-6
    else:
        assert service.arrivals[key] == []
    assert_same(projection, rows, error, seconds, A_QUARTER_TO_TWO)


@pytest.mark.slow
@pytest.mark.parametrize(("max_wait", "stops"), [(7200, False), (600, True)])
def test_a_quota_its_record_knows_spent_is_waited_for_within_max_wait_and_a_stop_beyond(tmp_path, max_wait, stops):
    """An hourly quota the service stated spent (an earlier run's, remembered on the key's budget)
    until 50 minutes from now: ``max_wait`` 7200 waits for it, 600 stops at once; the dry run and the
    run agree."""
    [key] = team_keys(1)
    spec = spec_of([key], tmp_path, ["{0} 600"], max_wait=max_wait)
    service = KeyedService({key: 600})
    wall0 = A_QUARTER_TO_TWO - 35 * 60  # 13:10
    until = wall0 + 50 * 60

    async def remembered(job: Job) -> None:
        await job.remember_spent(spec.keys[0], "hourly quota of 100 (stated by the service)", until)

    projection, rows, error, lanes, seconds = run_job(spec, service, wall0, 30, before=remembered)
    assert projection.stops == stops
    if stops:
        assert projection.sent == 0 and service.arrivals[key] == [] and projection.back == until
    else:
        assert [w.until for w in projection.waits] == [until] and min(service.arrivals[key]) >= 50 * 60 - 1e-6
    assert_same(projection, rows, error, seconds, wall0)


def test_two_keys_one_with_its_configured_quota_spent_the_job_goes_at_the_others_rate(tmp_path):
    """Key A (600/min, its daily quota spent by an earlier run) and key B (600/min): the dry run times
    300 requests at 600 requests/min (it summed 1200 before); the run sends none on A."""
    a, b = team_keys(2)
    spec = spec_of([a, b], tmp_path, ["{0} 600 quota=5/day", "{1} 600"], max_wait=1800)
    service = KeyedService({a: 600, b: 600})

    async def spent(job: Job) -> None:
        await job.spend(spec.keys[0], 5)

    projection, rows, error, lanes, seconds = run_job(spec, service, A_QUARTER_TO_TWO, 300, before=spent)
    assert projection.rate == 600 and not projection.waits and projection.sent == 300
    assert service.arrivals[a] == [] and service.admitted[b] == 300
    assert_same(projection, rows, error, seconds, A_QUARTER_TO_TWO)


def test_two_keys_each_with_room_go_at_their_summed_rate_until_one_is_spent(tmp_path):
    """A has 20 left of its hour, B has no quota: both send until A's 20 are gone, then B alone; the
    projection's time is the run's."""
    a, b = team_keys(2)
    spec = spec_of([a, b], tmp_path, ["{0} 600 quota=20/hour", "{1} 300"], max_wait=1800)
    service = KeyedService({a: 600, b: 300})
    projection, rows, error, lanes, seconds = run_job(spec, service, A_QUARTER_TO_TWO, 200)
    assert projection.rate == 900 and not projection.waits
    assert service.admitted[a] == 20
    assert_same(projection, rows, error, seconds, A_QUARTER_TO_TWO)


SUITE = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.mark.slow
@SUITE
@given(
    rpm=st.sampled_from([60, 300, 600, 1200]),
    limit=st.integers(3, 60),
    used=st.integers(0, 60),
    minute=st.integers(0, 59),
    requests=st.integers(1, 150),
    max_wait=st.sampled_from([60, 600, 1800, 3600, 7200]),
)
def test_a_configured_hourly_quota_the_dry_run_says_what_the_run_does(
    tmp_path_factory, rpm, limit, used, minute, requests, max_wait
):
    """Any rate, quota, count already paid, minute of the hour, job and ``max_wait``: the run sends
    what the projection says, stops where it says, and takes its time (cases within half a minute of
    ``max_wait``, where a second's latency decides, are left out: the rule is the same, the moment
    is not)."""
    used = min(used, limit)
    wall0 = A_QUARTER_TO_TWO - 45 * 60 + minute * 60 + 7
    [key] = team_keys(1)
    tmp_path = tmp_path_factory.mktemp("keys")
    spec = spec_of([key], tmp_path, [f"{{0}} {rpm} quota={limit}/hour"], max_wait=max_wait)

    async def paid_before(job: Job) -> None:
        await job.spend(spec.keys[0], used)

    async def projected():
        job = Job(spec, KeyedService({key: rpm}), wall0)
        await paid_before(job)
        return await job.look(requests)

    projection = virtual_clock.run(projected())
    decisions = [w.until - w.start for w in projection.waits]
    if projection.stops:
        decisions.append(projection.back - projection.stop_at)
    assume(all(abs(wait - max_wait) > 30 for wait in decisions))
    service = KeyedService({key: rpm})
    again, rows, error, lanes, seconds = run_job(spec, service, wall0, requests, before=paid_before)
    assert again == projection
    assert_same(projection, rows, error, seconds, wall0)


# -- the rule the run and the projection share ------------------------------------------------------------


def test_key_now_takes_a_key_out_until_its_spent_quota_or_its_latest_empty_reset():
    at = 1000.0
    hour = QuotaLeft("hourly", 0, at + 600, 40, "hour")
    day = QuotaLeft("daily", 0, at + 9000, 500, "day")
    assert key_now("k", 600, at, share=1.0, quotas=[hour, day]).out_until == at + 9000
    assert key_now("k", 600, at, share=1.0, quotas=[QuotaLeft("hourly", 3, at + 600)]).out_until is None
    assert key_now("k", 600, at, share=1.0, out=(at + 50, "spent")).why == "spent"
    assert key_now("k", 600, at, share=1.0, out=(at - 1, "spent")).out_until is None  # back already
    assert key_now("k", 600, at, share=1.0, refusal="you are not premium for this request").refused


def test_first_back_waits_for_the_nearest_reset_within_max_wait_and_never_for_a_refused_key():
    at = 0.0
    soon, late = key_now("a", 60, at, share=1.0, out=(300, "a")), key_now("b", 60, at, share=1.0, out=(5000, "b"))
    refused = key_now("c", 60, at, share=1.0, refusal="no")
    assert first_back([late, soon, refused], at, 600) is soon
    assert first_back([late, soon], at, 200) is None
    assert first_back([refused], at, math.inf) is None


def test_a_rate_not_known_yet_projects_no_time_but_the_same_waits_and_stops():
    at = A_QUARTER_TO_TWO
    quota = QuotaLeft("hourly quota of 10 (configured)", 10, at + 900, 10, "hour")
    unknown = project([key_now("k", None, at, share=1.0, quotas=[quota])], 25, at, 7200)
    assert unknown.seconds is None and unknown.rate is None and unknown.sent == 25
    assert [(w.sent, w.until - at) for w in unknown.waits] == [(10, 900), (20, 900 + HOUR)]


# -- a run's share of the key (issue 52, case 5) ---------------------------------------------------------


def test_key_now_sends_at_the_runs_share_of_the_keys_limit():
    at = 0.0
    assert key_now("k", 120, at, share=0.5).rate == 60
    assert key_now("k", None, at, share=0.5).rate is None  # a limit not known yet stays not known
    assert key_now("k", 0, at, share=0.5).rate == 0  # unpaced
    assert project([key_now("k", 120, at, share=0.5)], 40, at, 0).seconds == pytest.approx(39.0)  # 1 s apart


@pytest.mark.parametrize("share", [0.5, 0.25, 1.0])
def test_a_runs_share_is_what_the_dry_run_projects_and_what_the_run_then_takes(tmp_path, share):
    """``--rpm 120 --share 0.5``, 40 texts: the dry run projects the run's own pace, 60/min (its first
    request at once, then 39 a second apart: 39 s), and the run on the key's budget, which spaces its
    own starts by its share, takes that time; the run reads its key by the same function
    (``lane_now``: the same rate)."""
    from batchsum.engine._keys import lane_now

    [key] = team_keys(1)
    spec = spec_of([key], tmp_path, ["{0} 120"], max_wait=600, share=share)
    projection, rows, error, lanes, seconds = run_job(spec, KeyedService({key: 120}), A_QUARTER_TO_TWO, 40)
    assert projection.rate == 120 * share and projection.seconds == pytest.approx(39 * 60 / (120 * share))
    assert_same(projection, rows, error, seconds, A_QUARTER_TO_TWO)
    assert lane_now(lanes[0], 0.0).rate == projection.rate


@pytest.mark.slow
@pytest.mark.parametrize("where", ["machine", "redis"])
def test_the_run_the_dry_run_and_duckdbs_estimate_read_the_runs_share_on_each_budget(where, svc, request):
    """The real doors on the machine's budget and on Redis', ``rpm=120, share=0.5``, 40 texts: the dry
    run's words say the run's own pace and the time it takes (39 s: the first at once, then one a
    second), DuckDB's estimate the same seconds, and the run reads its key at that rate."""
    from batchsum.engine._keys import lane_now
    from batchsum.run.run import Run, dry_run
    from tests.support import KEY

    budget = request.getfixturevalue("redis_url") if where == "redis" else "machine"
    spec = RunSpec.from_kwargs(api_key=KEY, base_url=svc.url, rpm=120, share=0.5, budget=budget, progress=False)
    rows = texts(40, seed=52)
    plan = dry_run(spec, rows)
    assert "would send:       40 requests; at 60 requests/min that takes at least 0m39s" in plan, plan
    duckdb = pytest.importorskip("duckdb")
    import batchsum.duckdb

    con = duckdb.connect()
    try:
        batchsum.duckdb.register(con, api_key=KEY, base_url=svc.url, rpm=120, share=0.5, budget=budget, progress=False)
        (estimate,) = con.execute("SELECT batchsum_estimate(?)", [rows]).fetchone()
    finally:
        con.close()
    assert estimate["would_send"] == 40 and estimate["least_seconds"] == pytest.approx(39.0)

    async def run() -> tuple[float | None, list[str]]:
        async with Run(spec, total=2) as opened:
            lane = opened.pieces.lanes[0]
            done = [row.status async for row in opened.stream(rows[:2])]
            return lane_now(lane, lane.pacer.now()).rate, done

    rate, done = asyncio.run(run())
    assert rate == 60 and done == ["ok", "ok"] and svc.stats()["requests"] == 2
