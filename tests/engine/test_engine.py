"""The batch engine against the local service over loopback."""

import pytest

import batchsum
from batchsum.data.stores import MemoryStore
from batchsum.engine import fingerprint, plan_batch, summarize_stream
from batchsum.engine.tally import BatchStats
from batchsum.local import Faults, LocalService
from batchsum.local.summarizer import summarize as local_summary
from batchsum.pacing import Pacer
from batchsum.service.client import PreparedRequest, validate_params
from tests.support import EXPIRED_KEY, KEY, article


def texts(n, words=40):
    return [article(words, seed=i) + f" Row number {i} ends here." for i in range(n)]


async def collect(rows, svc, key=KEY, **kwargs):
    kwargs.setdefault("concurrency", 8)
    async with batchsum.AsyncClient(key, svc.url, max_retries=kwargs.pop("max_retries", 5)) as client:
        return [r async for r in summarize_stream(rows, client, **kwargs)]


@pytest.mark.slow
async def test_rows_in_equal_rows_out_in_order_each_with_its_own_summary(svc):
    svc.faults = Faults(rates={"500": 0.1, "drop": 0.05}, retry_after=0, seed=3)
    rows = texts(120, words=30) + [article(400, seed=99)]
    results = await collect(rows, svc, mode=2, percentage=2, type="bullets")
    assert len(results) == len(rows)
    for text, result in zip(rows, results):
        assert result.status == "ok", result
        assert result.summary == local_summary(text, 2, 2, "bullets")
        assert result.http_status == 200 and result.attempts >= 1


async def test_bad_rows_are_skipped_with_a_reason_and_never_sent(svc):
    rows = [None, float("nan"), 7, "", "   ", article(9), article(10), article(5000), article(5001), "ünïcödé " * 12]
    results = await collect(rows, svc)
    assert [(r.status, r.error) for r in results] == [
        ("skipped", "empty"),
        ("skipped", "empty"),
        ("skipped", "empty"),
        ("skipped", "empty"),
        ("skipped", "empty"),
        ("skipped", "too_short"),
        ("ok", None),
        ("ok", None),
        ("skipped", "too_long"),
        ("ok", None),
    ]
    assert all(r.message for r in results if r.status == "skipped")
    assert svc.stats()["requests"] == 3


async def test_identical_requests_are_sent_once_and_fan_out(svc):
    base = texts(5)
    rows = base * 4 + [base[0]]
    stats = BatchStats()
    results = await collect(rows, svc, stats=stats)
    assert [r.summary for r in results] == [r.summary for r in results[:5]] * 4 + [results[0].summary]
    assert svc.stats()["requests"] == 5 and svc.stats()["answered_twice"] == 0
    assert stats.sent == 5 and stats.reused == 16


async def test_other_parameters_are_other_requests(svc):
    row = texts(1)
    await collect(row, svc, mode=1)
    await collect(row, svc, mode=1, store=None)
    assert svc.stats()["requests"] == 2  # no store shared: sent again
    store = MemoryStore()
    await collect(row, svc, mode=1, store=store)
    await collect(row, svc, mode=1, store=store)
    await collect(row, svc, mode=1, percentage=5, store=store)
    assert svc.stats()["requests"] == 4


@pytest.mark.slow
async def test_zero_429s_at_the_configured_rpm_against_a_sliding_window_of_the_same_rpm():
    # 25 per 5-second sliding window is the same rate as 300 per minute: several windows in 9 s.
    with LocalService([KEY], rpm=25, window=5.0) as service:
        stats = BatchStats()
        results = await collect(texts(45, words=15), service, rpm=300, concurrency=8, stats=stats)
        assert all(r.status == "ok" for r in results)
        assert service.stats()["by_status"] == {"200": 45}
        assert stats.rate_limited == 0


async def test_a_429_storm_is_survived_with_every_row_accounted_for(svc):
    """A 429 answered by the shared pause is the service saying "later": it costs no attempt, and
    only the run's patience (``max_wait``) fails a row. With no patience at all, every row that met a
    429 fails as rate_limited with no paid attempt; the storm passes, and a second run sends only those."""
    svc.faults = Faults(rates={"429": 0.6}, retry_after=0.01, seed=7)
    rows = texts(60, words=12)
    stats = BatchStats()
    store = MemoryStore()
    results = await collect(rows, svc, stats=stats, store=store, max_retries=3, max_wait=0)
    assert len(results) == 60
    assert {r.status for r in results} <= {"ok", "failed"}
    failed = [r for r in results if r.status == "failed"]
    assert failed and all(r.error == "rate_limited" and r.http_status == 429 and r.attempts == 0 for r in failed)
    assert "max_wait is 0 s" in failed[0].message
    assert stats.rate_limited >= len(failed) and stats.ok + stats.failed == 60
    # The storm passes: a second run sends only what failed.
    svc.faults = Faults()
    svc.state.reset_stats()
    again = await collect(rows, svc, store=store)
    assert all(r.status == "ok" for r in again)
    assert svc.stats()["requests"] == len(failed)


async def test_a_storm_longer_than_the_retries_costs_no_row_and_no_attempt(svc):
    """Every one of the first 12 requests is answered 429 (Retry-After: 0.05 s): with 2 retries a row,
    the old rule failed the first row; under the shared pause every row is ok after one paid attempt."""
    svc.faults = Faults(script=["429"] * 12, retry_after=0.05)
    stats = BatchStats()
    results = await collect(texts(20, words=12), svc, stats=stats, max_retries=2)
    assert [(r.status, r.attempts) for r in results] == [("ok", 1)] * 20
    assert stats.rate_limited == 12 and stats.attempts == 20
    assert svc.stats()["by_status"] == {"200": 20, "429": 12}


@pytest.mark.slow
async def test_every_fault_kind_mixed_in_loses_no_row(svc):
    svc.faults = Faults(
        rates={"500": 0.1, "502": 0.1, "drop": 0.1, "garbled": 0.1, "429": 0.1, "hang": 0.02},
        retry_after=0,
        hang_seconds=2,
        seed=11,
    )
    rows = texts(80, words=12)
    async with batchsum.AsyncClient(KEY, svc.url, timeout=0.5, max_retries=8) as client:
        results = [r async for r in summarize_stream(rows, client, concurrency=8)]
    assert len(results) == 80
    for text, result in zip(rows, results):
        assert result.status == "ok" and result.summary == local_summary(text, 1, 4, None)


async def test_a_wrong_key_stops_the_batch_after_one_request(svc):
    with pytest.raises(batchsum.AuthenticationError, match="incorrect API key provided"):
        await collect(texts(50), svc, key="wrong-key", concurrency=16)
    assert svc.stats()["requests"] == 1


async def test_an_expired_plan_stops_the_batch_after_one_request(svc):
    with pytest.raises(batchsum.NotPremiumError, match="not premium"):
        await collect(texts(20), svc, key=EXPIRED_KEY)
    assert svc.stats()["requests"] == 1


async def test_a_401_mid_run_stops_the_batch_and_keeps_finished_rows(svc):
    svc.state.plans["rotating-key"] = svc.state.plans[KEY]
    store = MemoryStore()
    seen = []

    def revoke_after_ten(stats):
        if stats.done == 10:
            svc.state.plans.pop("rotating-key", None)

    async with batchsum.AsyncClient("rotating-key", svc.url) as client:
        with pytest.raises(batchsum.AuthenticationError):
            async for r in summarize_stream(
                texts(200), client, store=store, concurrency=1, window=1, on_result=revoke_after_ten
            ):
                seen.append(r)
    assert len(seen) >= 10 and all(r.status == "ok" for r in seen)
    assert len(store) == len(seen)
    assert svc.stats()["by_status"]["401"] == 1


async def test_422_answers_are_failed_rows_kept_and_not_sent_again(svc):
    rows = texts(3, words=60)
    store = MemoryStore()
    svc.faults = Faults(script=["422"] * 3)  # as if the live service counted words otherwise
    results = await collect(rows, svc, store=store, concurrency=1)
    assert [(r.status, r.error, r.http_status) for r in results] == [("failed", "unprocessable", 422)] * 3
    assert results[0].message == "Text exceeds word limit" and results[0].attempts == 1
    await collect(rows, svc, store=store)
    assert svc.stats()["requests"] == 3


async def test_invalid_parameters_raise_before_anything_is_sent(svc):
    for kwargs in ({"mode": 5}, {"percentage": 0}, {"type": "poem"}, {"concurrency": 0}):
        with pytest.raises(batchsum.InvalidParameterError):
            await collect(texts(2), svc, **kwargs)
    assert svc.stats()["requests"] == 0


async def test_memory_stays_bounded_by_the_window(svc):
    read = 0

    def endless():
        nonlocal read
        for i in range(10_000):
            read += 1
            yield article(12, seed=i)

    async with batchsum.AsyncClient(KEY, svc.url) as client:
        stream = summarize_stream(endless(), client, concurrency=2, window=16)
        first = [await stream.__anext__() for _ in range(5)]
        assert read <= 5 + 16 + 1  # the reader stays at most `window` rows ahead
        await stream.aclose()
    assert all(r.status == "ok" for r in first)


def test_a_dry_run_plan_counts_without_sending():
    store = MemoryStore()
    rows = texts(4) + [texts(4)[0], None, article(3)]
    params = validate_params(1)
    store.put(fingerprint(PreparedRequest(rows[1], params)), ("x", "ok", None, None, 200, 1))
    plan = plan_batch(rows, store=store)
    assert (plan.rows, plan.to_send, plan.known, plan.duplicates) == (7, 3, 1, 1)
    assert dict(plan.skipped_by_reason) == {"empty": 1, "too_short": 1}
    assert plan.minimum_seconds(60) == 2.0  # starts at 0, 1 and 2 seconds
    assert "would send:       3 requests" in plan.describe(60)


def test_a_dry_run_counts_a_long_texts_reduce_requests_and_says_row_once():
    plan = plan_batch([article(12_000)], long_texts_policy="split")
    text = plan.describe(60)
    assert f"would send:       {plan.to_send} to {plan.to_send + plan.reduce_max} requests" in text
    assert plan.reduce_max >= 1 and "1 row over the limit" in text and "1 rows" not in text


@pytest.mark.slow
async def test_in_flight_follows_rate_times_latency_instead_of_a_constant(svc):
    svc.faults = Faults(latency=3.0)
    stats = BatchStats()
    results = await collect(texts(120), svc, rpm=6000, concurrency=None, stats=stats)
    assert [r.status for r in results] == ["ok"] * 120
    # 6000/min = 100/s at 3 s each: about 300 on the wire, all 120 here; a constant 16 would cap the
    # rate at 5/s. More than 16 at once needs no more than 6 starts a second, however busy the machine.
    assert svc.stats()["most_in_progress"] > 16


@pytest.mark.slow
async def test_a_fixed_concurrency_is_a_cap(svc):
    svc.faults = Faults(latency=0.2)
    await collect(texts(40), svc, rpm=6000, concurrency=5)
    assert svc.stats()["most_in_progress"] <= 5


@pytest.mark.slow
async def test_a_storm_of_429s_that_ends_leaves_the_pace_where_it_was(svc):
    # The first 25 requests are refused with Retry-After 0.2: each text's first attempt, and then some.
    svc.faults = Faults(script=["429"] * 25, retry_after=0.2)
    stats = BatchStats()
    changes = []
    async with batchsum.AsyncClient(KEY, svc.url, max_retries=30) as client:
        pacer = Pacer(600, on_pace_change=changes.append)
        results = [r async for r in summarize_stream(texts(40), client, pacer=pacer, stats=stats)]
    assert [r.status for r in results] == ["ok"] * 40
    assert svc.stats()["by_status"] == {"200": 40, "429": 25}
    assert stats.rate_limited == 25 and pacer.pace == 600
    assert not [c for c in changes if c.pace < c.previous]


@pytest.mark.slow
async def test_more_than_a_hundred_in_flight_when_rate_times_latency_needs_it(svc):
    # 60000/min at 3 s each: all 300 on the wire at once; more than 100 needs no more than 34 starts a
    # second before the first answers, however busy the machine.
    svc.faults = Faults(latency=3.0)
    results = await collect([f"{article(12, seed=i)} Row {i}." for i in range(300)], svc, rpm=60000, concurrency=None)
    assert [r.status for r in results] == ["ok"] * 300
    assert svc.stats()["most_in_progress"] > 100  # the connection pool is no hidden cap


@pytest.mark.slow
async def test_answers_are_counted_when_they_arrive_while_a_held_row_waits_its_retry(svc):
    """Row 2 waits out a hung request (timeout 4 s) and its retry; results are yielded in order, but
    the counts (what the bar shows) take in the answers arriving behind it. The 28 other answers have
    the timeout's 4 s to arrive: a busy machine needs a fraction of that."""
    svc.faults = Faults(script=["ok", "hang"], hang_seconds=12)
    seen: list[tuple[int, int]] = []
    stats = BatchStats()

    def note(current: BatchStats) -> None:
        seen.append((current.ok, current.yielded))

    async with batchsum.AsyncClient(KEY, svc.url, timeout=4, max_retries=2) as client:
        results = [
            r async for r in summarize_stream(texts(30, words=12), client, stats=stats, on_result=note, concurrency=8)
        ]
    assert [r.status for r in results] == ["ok"] * 30 and results[1].attempts == 2
    assert max(ok for ok, yielded in seen if yielded <= 1) >= 25  # 28 answers counted while row 2 held the line
    assert stats.done == stats.yielded == 30 and stats.ok == 30


def _starts_on_the_virtual_clock(texts_in: list[str], **keywords) -> tuple[list, list[float], BaseException | None]:
    """``texts_in`` through ``summarize_stream`` with ``keywords``, on the virtual clock, answered by a
    transport of no latency: (rows, when each request started, the error it stopped with)."""
    import asyncio

    import httpx

    from batchsum.errors import QuotaSpent
    from tests import virtual_clock

    async def main():
        starts: list[float] = []
        loop = asyncio.get_running_loop()

        def answer(request):
            starts.append(loop.time())
            return httpx.Response(200, json={"result": "A summary."})

        rows, error = [], None
        async with batchsum.AsyncClient("k" * 20, "http://127.0.0.1:9", transport=httpx.MockTransport(answer)) as c:
            try:
                async for row in summarize_stream(texts_in, c, **keywords):
                    rows.append(row)
            except QuotaSpent as exc:
                error = exc
        return rows, starts, error

    return virtual_clock.run(main())


def test_summarize_stream_takes_a_share_of_the_keys_rate():
    """``share`` reaches the engine's entry: at rpm 600 the key's starts are 0.1 s apart, this call's
    own at half the rate 0.2 s (on the virtual clock)."""
    rows = texts(12)
    whole = _starts_on_the_virtual_clock(rows, rpm=600)[1]
    half = _starts_on_the_virtual_clock(rows, rpm=600, share=0.5)[1]
    assert len(whole) == len(half) == 12
    assert half[-1] - half[0] >= 2 * (whole[-1] - whole[0]) * 0.95


def test_summarize_stream_counts_a_quota_on_the_keys_budget():
    """``quota`` reaches the engine's entry, counted on the budget given: 5 a day over 8 texts sends 5,
    and the call stops on the quota spent, every other row not sent."""
    import asyncio

    from batchsum.pacing.budgets.budget import ProcessBudget

    class OnTheLoopsClock(ProcessBudget):
        def __init__(self) -> None:
            super().__init__(lambda: asyncio.get_running_loop().time(), shared=True)

    rows, starts, error = _starts_on_the_virtual_clock(texts(8), rpm=600, quota="5/day", budget=OnTheLoopsClock())
    assert len(starts) == 5 and error is not None
    assert [row.status for row in rows].count("ok") == 5 and [row.error for row in rows][5:] == ["not_sent"] * 3


@pytest.mark.parametrize(
    ("keywords", "words"),
    [
        ({"max_retries": 2}, "summarize_stream takes no max_retries: the client's (AsyncClient(max_retries=...))"),
        ({"timeout": 5}, "summarize_stream takes no timeout: the client's"),
        ({"keys": "keys.txt"}, "summarize_stream takes no keys: give lanes="),
        ({"refresh": True}, "summarize_stream takes no refresh: it sends what its store= does not hold"),
        ({"sample": 3}, "summarize_stream takes no sample: give sample_rows="),
        ({"quota": "5/day"}, "summarize_stream's quota is counted on the key's budget: give budget= too"),
        ({"share": 2}, "invalid share 2"),
        ({"store": "machine"}, "invalid store 'machine': summarize_stream takes an answer store object"),
        ({"budget": "machine"}, "invalid budget 'machine': open one with"),
    ],
)
async def test_summarize_stream_refuses_a_run_option_set_elsewhere_in_one_line_naming_where(svc, keywords, words):
    with pytest.raises(batchsum.InvalidParameterError) as raised:
        async with batchsum.AsyncClient(KEY, svc.url) as client:
            [row async for row in summarize_stream(texts(2), client, **keywords)]
    assert str(raised.value).startswith(words) and "\n" not in str(raised.value)
    assert svc.stats()["requests"] == 0
