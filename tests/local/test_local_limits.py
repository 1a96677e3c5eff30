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
from batchsum.local import Faults, LocalService
from tests.conftest import KEY, article


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


async def _run(service: LocalService, n: int, key: str = KEY) -> list:
    rows = []
    async with batchsum.AsyncClient(key, service.url) as client:
        try:
            async for row in summarize_stream([article(30, seed=i) for i in range(n)], client, rpm=600):
                rows.append(row)
        except batchsum.AuthenticationError:
            pass
    return rows


def test_batchsum_uses_the_room_a_service_states_at_once_and_no_more():
    faults = Faults(latency=0.2)
    with LocalService([KEY], rpm=600, limit_kind="fixed", room_headers="x-ratelimit", faults=faults) as service:
        rows = asyncio.run(_run(service, 40))
        stats = service.stats()
    assert [r.status for r in rows] == ["ok"] * 40
    assert stats["by_status"] == {"200": 40}
    # After the first answer (alone), the other 39 went on the stated room, at up to ten times the plan
    # (about 20 on the wire with 0.2 s answers); the even pace keeps ~2 on the wire.
    assert stats["most_in_progress"] >= 12


def test_a_bad_key_costs_one_request_against_a_stating_service():
    with LocalService([KEY], rpm=600, limit_kind="fixed", room_headers="ratelimit") as service:
        rows = asyncio.run(_run(service, 40, key="a-wrong-key-0123456789"))
        stats = service.stats()
    assert rows == [] and stats["requests"] == 1
