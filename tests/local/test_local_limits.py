"""The local service's limit kinds and room headers over loopback (the switches the short-job
benchmark uses): a sliding window (the default), a fixed window from the key's first request, a
token bucket that starts full; ``room_headers`` states the room left in every answer, and batchsum
uses it at once. Small windows, so nothing waits; no timing is asserted."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import batchsum
from batchsum.engine import summarize_stream
from batchsum.local import Account, Faults, LocalService
from tests.support import KEY, article, wait_for


def post(client: httpx.Client, key: str = KEY) -> httpx.Response:
    return client.post(
        "/api/user/summarize", json={"text": article(30), "mode": 1}, headers={"Authorization": f"Bearer {key}"}
    )


@pytest.mark.parametrize("kind", ["sliding", "fixed", "bucket"])
@pytest.mark.parametrize("style", ["ratelimit", "x-ratelimit"])
def test_each_limit_kind_states_the_room_it_leaves_and_refuses_past_it(kind, style):
    prefix = "RateLimit-" if style == "ratelimit" else "X-RateLimit-"
    with LocalService([KEY], rpm=3, window=600, limit_kind=kind, room_headers=style) as service:
        with httpx.Client(base_url=service.url) as client:
            answers = [post(client) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert [a.headers[f"{prefix}Remaining"] for a in answers] == ["2", "1", "0", "0"]
    assert all(a.headers[f"{prefix}Limit"] == "3" for a in answers)
    assert all(1 <= int(a.headers[f"{prefix}Reset"]) <= 600 for a in answers)
    assert int(answers[-1].headers["Retry-After"]) >= 1


def test_by_default_the_service_states_no_room_as_the_live_one():
    with LocalService([KEY], rpm=3) as service:
        with httpx.Client(base_url=service.url) as client:
            answer = post(client)
    assert answer.status_code == 200
    assert not [name for name in answer.headers if "ratelimit" in name.lower()]


def test_unknown_switches_are_refused():
    with pytest.raises(ValueError, match="limit_kind"):
        LocalService(limit_kind="leaky")
    with pytest.raises(ValueError, match="room_headers"):
        LocalService(room_headers="yes")
    assert Faults.from_json({"latency": 0.4, "latency_spread": 0.2}).latency_spread == 0.2
    faults = Faults.from_json({"latency": 2, "latency_after": 3, "hold_after": 5})
    assert (faults.latency_after, faults.hold_after) == (3, 5) and Faults.from_json({}).hold_after is None
    for bad in ({"latency_after": -1}, {"hold_after": 1.5}):
        with pytest.raises(ValueError, match="whole number of requests"):
            Faults(**bad)


def test_latency_after_n_answers_the_first_n_at_once_and_the_rest_in_their_latency():
    faults = Faults(latency=1.5, latency_after=3)
    numbers = [faults.arrive() for _ in range(5)]
    assert numbers == [1, 2, 3, 4, 5]
    assert [faults.delay(n) for n in numbers] == [0.0, 0.0, 0.0, 1.5, 1.5]


def _send_in_threads(service: LocalService, count: int) -> tuple[list, list]:
    import threading

    answers: list = []

    def one(i: int) -> None:
        with httpx.Client(base_url=service.url, timeout=60) as client:
            answers.append(
                client.post(
                    "/api/user/summarize",
                    json={"text": article(30, seed=i), "mode": 1},
                    headers={"Authorization": f"Bearer {KEY}"},
                )
            )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads, answers


@pytest.mark.parametrize("how", ["release", "replace"])
def test_requests_after_hold_after_wait_unanswered_until_released_or_the_faults_are_replaced(how):
    with LocalService([KEY], faults=Faults(hold_after=2)) as service:
        threads, answers = _send_in_threads(service, 4)
        wait_for(lambda: len(answers) == 2 and service.state.in_progress == 2, what="2 answered, 2 held")
        assert service.stats()["answered"] == 2  # the other two are held in the service, unanswered
        if how == "release":
            service.faults.release()
        else:
            service.faults = Faults()
        for thread in threads:
            thread.join(60)
        assert [a.status_code for a in answers] == [200] * 4 and service.stats()["answered"] == 4


def test_a_request_that_arrived_before_the_counts_were_reset_is_not_counted_after():
    """Nor in progress: a test's hung request is not the next test's (a run killed mid-way leaves
    its requests at the service until they end)."""
    with LocalService([KEY], faults=Faults(hold_after=0)) as service:
        threads, answers = _send_in_threads(service, 1)
        wait_for(lambda: service.state.in_progress == 1, what="the request held")
        service.state.reset_stats()  # the next test's counts begin
        assert service.state.in_progress == 0 and service.stats()["most_in_progress"] == 0
        service.faults.release()
        threads[0].join(60)
        assert answers[0].status_code == 200
        assert service.stats()["requests"] == 0 and service.state.in_progress == 0


@pytest.mark.parametrize("how", ["state", "route"])
def test_a_reset_puts_the_service_back_as_it_was_made_whatever_a_test_left_in_it(how):
    """What a test leaves in a service it shares with the next (a key's window made at a limit of 1,
    the limit, a plan added, an account's quota spent, faults holding a request, counts) is gone after
    ``state.reset()`` or ``POST /_local/reset``: a limit set then is the one in force."""
    quota_key = "test-key-quota-0123456789"
    with LocalService([KEY, quota_key], rpm=600, accounts={quota_key: Account(quota=1)}) as service:
        admin = {"Authorization": f"Bearer {service.state.admin_key}"}
        with httpx.Client(base_url=service.url, timeout=60) as client:
            service.state.rpm = 1
            assert [post(client).status_code for _ in range(2)] == [200, 429]
            assert [post(client, quota_key).status_code for _ in range(2)] == [200, 429]
            service.state.plans["test-key-added-0123456789"] = service.state.plans[KEY]
            service.state.rpm = 0  # the held request is admitted
            service.faults = Faults(hold_after=0)
            threads, answers = _send_in_threads(service, 1)
            wait_for(lambda: service.state.in_progress == 1, what="the request held")
            if how == "state":
                service.state.reset()
            else:
                assert client.post("/_local/reset", headers=admin).status_code == 200
            threads[0].join(60)
            assert [a.status_code for a in answers] == [200]  # the faults that held it are gone
            assert service.stats()["requests"] == 0 and service.state.rpm == 600
            assert post(client, "test-key-added-0123456789").status_code == 401
            assert post(client, quota_key).status_code == 200  # a quota whole again
            service.state.rpm = 2  # the limit set after the reset is the one the key meets
            assert [post(client).status_code for _ in range(3)] == [200, 200, 429]


async def _run(service: LocalService, n: int, key: str = KEY) -> list:
    rows = []
    async with batchsum.AsyncClient(key, service.url) as client:
        try:
            async for row in summarize_stream([article(30, seed=i) for i in range(n)], client, rpm=600):
                rows.append(row)
        except batchsum.AuthenticationError:
            pass
    return rows


@pytest.mark.slow
def test_batchsum_uses_the_room_a_service_states_at_once_and_no_more():
    faults = Faults(latency=1.0)  # 1 s answers: 20 on the wire needs 20 starts in a second, any machine's
    with LocalService([KEY], rpm=600, limit_kind="fixed", room_headers="x-ratelimit", faults=faults) as service:
        rows = asyncio.run(_run(service, 40))
        stats = service.stats()
    assert [r.status for r in rows] == ["ok"] * 40
    assert stats["by_status"] == {"200": 40}
    # After the first answer (alone), the other 39 went on the stated room, at up to ten times the plan
    # (up to all 39 on the wire with 1 s answers); the even pace would keep ~10 on the wire.
    assert stats["most_in_progress"] >= 20


def test_a_bad_key_costs_one_request_against_a_stating_service():
    with LocalService([KEY], rpm=600, limit_kind="fixed", room_headers="ratelimit") as service:
        rows = asyncio.run(_run(service, 40, key="a-wrong-key-0123456789"))
        stats = service.stats()
    assert rows == [] and stats["requests"] == 1
