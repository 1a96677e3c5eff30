"""Quotas longer than a minute, on virtual time: a quota the service states never passes for a
per-minute limit (issue 40: under ``rpm="auto"`` it never raises the pace, and nothing remembers it
as the key's limit), and quotas stated or configured take their key out of a run until their reset."""

from __future__ import annotations

import time

import httpx

import batchsum
from batchsum.engine import summarize_stream
from batchsum.local.state import SlidingWindow
from batchsum.pacing import Pacer
from batchsum.pacing.record import LIMIT
from tests import virtual_clock
from tests.pacing.test_short_job import KEY, Service, record_of, told, uniform


def texts(n: int, seed: int = 0) -> list[str]:
    return [f"Quota text {seed}-{i} has enough words in it to be worth a summary of its own." for i in range(n)]


class QuotaStating(Service):
    """A strict sliding minute that also states a quota of 10000 with no window and a reset hours away
    (``X-RateLimit-*``), in every answer: a quota, not a per-minute limit."""

    def __init__(self, rpm: int, seed: int = 0) -> None:
        super().__init__("sliding", latency=uniform(0.3, 0.7, seed), rpm=rpm)
        self.limit = SlidingWindow(rpm, 60.0)
        self.used = 0

    def room_headers(self, now: float) -> dict[str, str]:
        self.used += 1
        return {
            "X-RateLimit-Limit": "10000",
            "X-RateLimit-Remaining": str(10000 - self.used),
            "X-RateLimit-Reset": str(int(time.time()) + 5 * 3600),
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


def test_under_auto_a_stated_quota_with_no_window_and_a_reset_hours_away_is_no_per_minute_limit():
    """Issue 40: ``X-RateLimit-Limit: 10000`` with a reset hours away is a quota. The run goes exactly
    as against a service that states nothing (no pace raised to 10000, no storm of 429s), and the
    key's record remembers no "10000 stated"."""
    silent = Service("sliding", latency=uniform(0.3, 0.7), rpm=240)
    silent.limit = SlidingWindow(240, 60.0)
    stating = QuotaStating(240)
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
