"""The pacer and in-flight sizing on virtual time (``tests/virtual_clock.py``): the window bound, no
burst at the start or after a pause, the shared pause, in flight following rate x latency, AIMD that
recovers after a storm and settles under a real lower limit, rate-limit headers, a user's limiter.

The simulated service decides at each attempt's start (loopback: arrival = start) with the same
sliding window as the local service, and answers after a latency. Counts are asserted, never wall
time: the clock is virtual, so every figure here is exact and repeatable."""

from __future__ import annotations

import asyncio
import bisect
import math
import random

import pytest
from aiolimiter import AsyncLimiter

import batchsum
from batchsum.engine._gate import Gate
from batchsum.engine._keys import FirstRequest, Keys
from batchsum.engine.lanes import KeyLane
from batchsum.errors import RateLimitError, ServerError
from batchsum.local.state import SlidingWindow
from batchsum.pacing import JITTER_MARGIN, START_IN_FLIGHT, Pacer, max_starts
from batchsum.service.rate_headers import RateStatement
from tests import virtual_clock


def most_in_any_window(times, window):
    """The largest number of events in a closed window [t, t + window], over every t."""
    times = sorted(times)
    return max((bisect.bisect_right(times, t + window) - i for i, t in enumerate(times)), default=0)


def between(times, lo, hi):
    return sum(1 for t in times if lo <= t < hi)


class Sim:
    """A service on virtual time: a per-key sliding-window ``limit`` (429 with Retry-After as the local
    service computes it), storms (``storm(t) -> retry_after or False``), and a ``latency(t)``."""

    def __init__(self, *, limit=None, latency=lambda t: 0.05, storm=lambda t, first: False, headers=None):
        self.window = SlidingWindow(limit) if limit else None
        self.latency = latency
        self.storm = storm
        self.headers = headers
        self.starts, self.refused, self.admitted = [], [], []
        self.max_on_wire = 0
        self.on_wire = 0

    def decide(self, t, first):
        storm = self.storm(t, first)
        if storm is not False:
            return storm
        if self.window is not None:
            wait = self.window.admit(t)
            if wait is not None:
                return max(1, math.ceil(wait))
        return None


def engine_hooks(pacer):
    """The attempt hooks the engine gives a request on a batch's one key (its gate, with the key's
    pacer): what ``AsyncClient.send`` awaits before each attempt and tells after it."""
    lane = KeyLane(batchsum.AsyncClient("test-key-pacing-0123456789", "http://127.0.0.1:9"), pacer)
    keys = Keys([(lane, FirstRequest(None, 1, alone=False))], max_wait=1800.0, on_quota=lambda error: None)
    return Gate(keys).hooks(keys.states[0])


async def send_one(gate, sim, *, delay=0.0):
    """One sender: one request through ``gate``, retried until ``sim`` answers it."""
    if delay:
        await asyncio.sleep(delay)
    first = True
    while True:
        ticket = await gate.before_attempt()
        start = ticket[1]
        sim.starts.append(start)
        sim.on_wire += 1
        sim.max_on_wire = max(sim.max_on_wire, sim.on_wire)
        retry_after = sim.decide(start, first)
        first = False
        await asyncio.sleep(sim.latency(start))
        sim.on_wire -= 1
        if retry_after is None:
            sim.admitted.append(start)
            gate.after_attempt(ticket, None, sim.headers(start) if sim.headers else None)
            return
        sim.refused.append(start)
        error = RateLimitError("Too Many Requests", status_code=429, retry_after=retry_after or None)
        gate.after_attempt(ticket, error, None)


def simulate(rpm, sim, *, texts, concurrency=None, limiter=None, stop_at=None, pacer=None, spread=0.0):
    """``texts`` senders (one request each, retried until answered) through one pacer; returns the pacer.
    ``spread``: senders arrive over this many seconds (a stream of rows) instead of all at once."""
    pacer = pacer or Pacer(rpm, max_in_flight=concurrency, limiter=limiter)
    gate = engine_hooks(pacer)

    async def main():
        tasks = [asyncio.ensure_future(send_one(gate, sim, delay=spread * i / texts)) for i in range(texts)]
        if stop_at is None:
            await asyncio.gather(*tasks)
        else:
            await asyncio.sleep(stop_at)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    virtual_clock.run(main())
    return pacer


# -- spacing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("rpm", [1, 7, 60, 250, 3000])
def test_no_window_ever_holds_more_than_its_share(rpm):
    rng = random.Random(rpm)
    sim = Sim(latency=lambda t: 0.3, storm=lambda t, first: (rng.random() < 0.05) and 2.0)
    simulate(rpm, sim, texts=300)
    assert len(sim.starts) > 300
    for window in [0.01, 0.5, 1, 2.5, 7, 10, 30, 59.9, 60, 61, 120, 600]:
        assert most_in_any_window(sim.starts, window) <= max_starts(rpm, window), window


def test_the_first_minute_has_no_burst():
    sim = Sim(latency=lambda t: 0.3)
    simulate(60, sim, texts=150)
    assert most_in_any_window(sim.starts, 60) <= 61
    assert most_in_any_window(sim.starts, 1) <= 2
    gaps = [b - a for a, b in zip(sim.starts, sim.starts[1:])]
    assert min(gaps) == pytest.approx(1 + JITTER_MARGIN)


def test_a_429_pauses_every_sender_until_retry_after_and_the_restart_has_no_burst():
    sim = Sim(latency=lambda t: 0.3, storm=lambda t, first: 5.0 if 70.0 <= t < 70.4 else False)
    pacer = simulate(120, sim, texts=200)
    assert len(sim.refused) == 1
    answered_at = sim.refused[0] + 0.3
    after = [s for s in sim.starts if s > answered_at]
    assert not [s for s in after if s < answered_at + 5.0 - 1e-6]  # nobody started during the pause
    gaps = [b - a for a, b in zip(after, after[1:])]
    normal = 60 / 120 * (1 + JITTER_MARGIN)
    assert min(gaps) >= normal * 0.999  # no burst after the pause ...
    assert gaps[0] > 1.5 * normal  # ... the ramp starts slow ...
    assert gaps[-1] == pytest.approx(normal)  # ... and returns to the full pace
    # A 429 after a whole minute admitted at the pace lowers nothing: the pace was not too high.
    assert pacer.pace == 120 and pacer.changes == []


def test_a_lone_429_early_in_a_run_may_lower_the_pace_which_then_climbs_back_and_says_why():
    sim = Sim(latency=lambda t: 0.3, storm=lambda t, first: 5.0 if 10.0 <= t < 10.4 else False)
    pacer = simulate(120, sim, texts=200)
    assert [c.pace < c.previous for c in pacer.changes] == [True, False]
    assert "admitting 20 requests" in pacer.changes[0].reason
    assert pacer.changes[1].pace == 120 and "clean" in pacer.changes[1].reason
    assert pacer.changes[1].at - 15.4 < 60  # back within a minute of the pause


def test_rpm_0_does_not_pace_but_still_shares_429_pauses():
    async def main():
        pacer = Pacer(0)
        starts = [await pacer.before_attempt() for _ in range(5)]
        pacer.after_attempt(starts[-1], rate_limited=True, retry_after=3.0)
        starts.append(await pacer.before_attempt())
        return starts

    starts = virtual_clock.run(main())
    assert starts[:5] == [0.0] * 5 and starts[5] == 3.0


@pytest.mark.parametrize("retry_after", [None, 0.0])
def test_a_429_without_a_usable_retry_after_backs_off_and_never_waits_zero(retry_after):
    async def main():
        pacer = Pacer(600)
        first = await pacer.before_attempt()
        pacer.after_attempt(first, rate_limited=True, retry_after=retry_after or None)
        state = pacer.state()
        return state, await pacer.before_attempt() - first

    state, gap = virtual_clock.run(main())
    assert state.paused_for >= 0.375 and "without a usable Retry-After" in state.pause_reason
    assert gap >= 0.375


@pytest.mark.parametrize("rpm", [-1, float("nan"), float("inf"), "60", True])
def test_an_invalid_rpm_is_refused_where_it_enters_and_the_pacer_takes_it_checked(rpm):
    from batchsum.engine import RunOptions

    with pytest.raises(ValueError, match="invalid rpm"):
        RunOptions.of(rpm=rpm)  # summarize_stream's keywords
    with pytest.raises(AssertionError):
        Pacer(rpm)  # checked before it gets here: an assert, not a second check


def test_a_start_that_goes_out_late_does_not_shorten_the_gap_to_the_next():
    """A busy event loop (here: work that holds it 30 ms, now and then) makes some starts go out
    after their slot; the next start still waits a whole interval after the late one."""
    rng = random.Random(7)
    sim = Sim(latency=lambda t: 0.3)

    async def busy():
        loop = asyncio.get_running_loop()
        for _ in range(200):
            await asyncio.sleep(rng.uniform(0.01, 0.2))
            loop.now += 0.03  # the loop is held: nothing else runs meanwhile

    pacer = Pacer(600)
    gate = engine_hooks(pacer)

    async def main():
        worker = asyncio.ensure_future(busy())
        await asyncio.gather(*(send_one(gate, sim) for _ in range(300)))
        worker.cancel()

    virtual_clock.run(main())
    gaps = [b - a for a, b in zip(sim.starts, sim.starts[1:])]
    assert min(gaps) >= pacer.interval - 1e-9
    assert sum(1 for g in gaps if g > pacer.interval + 0.001) > 20  # the loop did hold some back


def test_an_attempt_that_does_not_go_at_its_turn_gives_its_start_to_the_next_and_nothing_is_counted():
    """``at_turn`` says no for every third attempt (its text claimed by another run): that attempt
    raises ``TurnGiven`` without a start committed on the budget, and the next attempt goes in the
    start it had reserved; the starts that went out keep the spacing, and the budget counts only them."""
    from batchsum.pacing.budgets.budget import ProcessBudget

    budget = ProcessBudget(lambda: asyncio.get_running_loop().time())
    pacer = Pacer(600, budget=budget)

    async def main():
        asked, given, starts = await every_third_turn_given(pacer)
        return asked, given, starts, (await budget.look()).starts

    asked, given, starts, counted = virtual_clock.run(main())
    assert counted == 20
    # An attempt that took a start given on asked at the time it was due, not an interval later.
    times = dict(asked)
    assert all(times[i + 1] == times[i] for i in given if i + 1 < 30)


async def every_third_turn_given(pacer: Pacer, claim_seconds: float = 0.0) -> tuple[list, list[int], list[float]]:
    """Thirty attempts through ``pacer`` whose ``at_turn`` says no, after ``claim_seconds`` (a claim a
    round trip away), for every third (its text claimed by another run): each of those raises
    ``TurnGiven``, and the 20 starts that went out keep the spacing. Returns (attempt, when its turn
    was asked) pairs, the attempts given on, and the starts."""
    from batchsum.pacing.pacer import TurnGiven

    asked, given, starts = [], [], []

    async def attempt(i):
        async def at_turn():
            asked.append((i, asyncio.get_running_loop().time()))
            if claim_seconds:
                await asyncio.sleep(claim_seconds)
            return i % 3 != 1

        try:
            starts.append(await pacer.before_attempt(at_turn))
        except TurnGiven:
            given.append(i)

    await asyncio.gather(*(attempt(i) for i in range(30)))
    assert given == [i for i in range(30) if i % 3 == 1] and len(starts) == 20
    assert min(b - a for a, b in zip(starts, starts[1:])) >= pacer.interval - 1e-9
    return asked, given, starts


@pytest.mark.parametrize("share", [1e-5, 0.0002])
def test_a_share_below_one_start_an_hour_is_refused_naming_the_share(share):
    from batchsum.errors import InvalidParameterError
    from batchsum.options import RunSpec

    with pytest.raises(InvalidParameterError, match=r"invalid share .* \(one request an hour\)"):
        RunSpec.from_kwargs(api_key="k" * 20, rpm=60, share=share)
    assert RunSpec.from_kwargs(api_key="k" * 20, rpm=60, share=0.0003).share == 0.0003  # 1.08 an hour


def test_the_command_line_names_the_flag_of_a_refused_share(tmp_path, capsys, monkeypatch):
    from batchsum.cli import main

    monkeypatch.setenv("BATCHSUM_API_KEY", "k" * 20)
    (tmp_path / "in.csv").write_text("text\nhello\n")
    code = main(
        [
            "summarize",
            str(tmp_path / "in.csv"),
            "-o",
            str(tmp_path / "out.csv"),
            "--column",
            "text",
            "--rpm",
            "60",
            "--share",
            "0.00001",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "invalid --share 1e-05" in err


# -- in flight follows rate x latency --------------------------------------------------------------


@pytest.mark.parametrize("latency", [0.05, 1.0, 5.0, 20.0])
def test_the_start_rate_holds_the_pace_at_any_latency(latency):
    sim = Sim(latency=lambda t: latency)
    simulate(600, sim, texts=1500)
    per_minute = between(sim.starts, 60, 120)
    assert per_minute >= 0.98 * 600, per_minute
    assert most_in_any_window(sim.starts, 60) <= max_starts(600, 60)
    assert sim.max_on_wire <= math.ceil(600 / 60 * latency * 1.5) + 10 or sim.max_on_wire <= START_IN_FLIGHT


def test_a_fixed_concurrency_caps_the_rate_at_concurrency_over_latency():
    sim = Sim(latency=lambda t: 5.0)
    simulate(600, sim, texts=600, concurrency=16)
    assert between(sim.starts, 30, 90) <= 16 / 5 * 60 + 16
    assert sim.max_on_wire == 16


def test_in_flight_grows_when_latency_grows_and_shrinks_back():
    sim = Sim(latency=lambda t: 0.05 if t < 60 or t >= 180 else 20.0)
    pacer = simulate(600, sim, texts=2600)
    assert between(sim.starts, 120, 180) >= 0.98 * 600  # at 20 s the pace holds: about 200 on the wire
    assert sim.max_on_wire >= 190
    assert between(sim.starts, 200, 250) >= 0.98 * 500
    assert pacer.in_flight.on_wire == 0 and pacer.in_flight.held == 0


def test_before_any_answer_the_oldest_request_age_raises_the_limit():
    sim = Sim(latency=lambda t: 30.0)
    simulate(600, sim, texts=400, stop_at=29.0)
    assert len(sim.starts) >= 0.98 * 600 * 29 / 60  # no answer yet, and the pace held anyway


# -- AIMD -----------------------------------------------------------------------------------------


def test_a_storm_after_a_full_minute_lowers_nothing_and_the_pace_holds_after_it():
    sim = Sim(latency=lambda t: 0.5, storm=lambda t, first: 1.0 if 70 <= t < 100 else False)
    pacer = simulate(600, sim, texts=1800)
    assert len(sim.refused) > 10
    assert pacer.pace == 600 and pacer.changes == []
    assert between(sim.admitted, 110, 170) >= 0.95 * 600


@pytest.mark.parametrize("retry_after", [1.0, 0])  # 0: no Retry-After at all, a backoff
def test_a_storm_early_in_a_run_may_lower_the_pace_but_it_climbs_back_within_a_minute(retry_after):
    sim = Sim(latency=lambda t: 0.5, storm=lambda t, first: retry_after if 20 <= t < 50 else False)
    pacer = simulate(600, sim, texts=1500)
    assert pacer.pace == 600
    assert between(sim.admitted, 110, 170) >= 0.95 * 600
    for change in pacer.changes:
        assert change.reason  # each reported once, with why


def test_refusing_every_texts_first_attempt_never_lowers_the_pace():
    sim = Sim(latency=lambda t: 0.05, storm=lambda t, first: first and 1.0)
    pacer = simulate(600, sim, texts=40)
    assert len(sim.admitted) == 40 and len(sim.refused) == 40
    assert pacer.pace == 600 and not [c for c in pacer.changes if c.pace < c.previous]
    assert max(sim.admitted) < 150  # 40 texts, each paused ~1 s: not hours


@pytest.mark.parametrize("latency", [0.05, 5.0])
def test_a_limit_truly_half_of_rpm_is_found_and_held_with_few_429s(latency):
    sim = Sim(limit=300, latency=lambda t: latency)
    pacer = simulate(600, sim, texts=2000)
    assert abs(pacer.pace - 300) <= 30, pacer.changes
    assert all(abs(c.pace - 300) <= 30 for c in pacer.changes)
    # The first 429 comes back a latency after the window filled: what was sent meanwhile at the
    # configured pace is refused too (rpm x latency of them). After that, a handful in all.
    on_the_wire_at_first = math.ceil(600 / 60 * latency)
    assert len(sim.refused) < 25 + on_the_wire_at_first
    admitted_late = between(sim.admitted, 240, 360)
    assert admitted_late >= 0.9 * 600, admitted_late  # two minutes at about 300/min
    assert pacer.changes[0].pace < 600 and "admitting" in pacer.changes[0].reason


def test_rate_limit_headers_set_the_pace_before_any_429():
    # The service states its limit and, truthfully, the room its window leaves at each request.
    sim = Sim(limit=240, latency=lambda t: 0.05)
    sim.headers = lambda t: RateStatement(240, None, *sim.window.room(t))
    pacer = simulate(600, sim, texts=400)
    assert pacer.pace == 240 and len(sim.refused) == 0
    assert "headers" in pacer.changes[0].reason


def test_headers_saying_none_remain_pause_until_the_reset():
    # Only the answer at 5 s names a reset: the others state no room to use at once (test_short_job.py).
    headers = lambda t: RateStatement(remaining=0, reset=7) if 5 <= t < 5.1 else RateStatement(remaining=50)  # noqa: E731
    sim = Sim(latency=lambda t: 0.05, headers=headers)
    simulate(600, sim, texts=100)
    told = min(s for s in sim.starts if s >= 5) + 0.05  # the answer saying "none left" arrives
    assert not [s for s in sim.starts if told < s < told + 7 - 1e-6]  # paused for the reset: no 429 needed
    assert len(sim.starts) == 100


# -- a user's limiter ------------------------------------------------------------------------------


def test_a_users_async_limiter_shared_by_two_batches_spaces_them_together():
    limiter = AsyncLimiter(1, 0.5)  # 120/min for both
    sims = [Sim(latency=lambda t: 0.2), Sim(latency=lambda t: 0.2)]

    async def main():
        async def batch(sim):
            pacer = Pacer(120, limiter=limiter)
            gate = engine_hooks(pacer)

            async def one():
                ticket = await gate.before_attempt()
                sim.starts.append(ticket[1])
                await asyncio.sleep(0.2)
                gate.after_attempt(ticket, None, None)

            await asyncio.gather(*(one() for _ in range(60)))

        await asyncio.gather(*(batch(sim) for sim in sims))

    virtual_clock.run(main())
    together = sorted(sims[0].starts + sims[1].starts)
    assert most_in_any_window(together, 60) <= max_starts(120, 60)
    assert len(sims[0].starts) == len(sims[1].starts) == 60


def test_5xx_answers_neither_lower_nor_pause():
    async def main():
        pacer = Pacer(600)
        gate = engine_hooks(pacer)
        for _ in range(20):
            ticket = await gate.before_attempt()
            gate.after_attempt(ticket, ServerError("boom", status_code=500), None)
        return pacer, pacer.state()

    pacer, state = virtual_clock.run(main())
    assert pacer.pace == 600 and state.paused_for == 0


def test_the_progress_line_says_why_it_waits_the_pace_and_what_is_in_flight():
    from batchsum.engine.tally import BatchStats
    from batchsum.run.progress import ProgressBar

    async def main():
        pacer = Pacer(600)
        gate = engine_hooks(pacer)
        stats = BatchStats(pacer=pacer)
        first = await gate.before_attempt()
        second = await gate.before_attempt()
        gate.after_attempt(first, RateLimitError("Too Many Requests", status_code=429, retry_after=41), None)
        return ProgressBar.describe(stats), second

    line, _ = virtual_clock.run(main())
    assert "waiting 41 s: the service answered 429 (Retry-After 41)" in line
    assert "pace 600/min" in line and "in flight 1" in line and "429s 1" in line
