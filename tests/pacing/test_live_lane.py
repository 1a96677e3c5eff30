"""The live lane (issue 54): a gateway's requests take the key's next turn ahead of the batch runs'
reserved starts, on the machine's budget (a commit per start) and on one 20 ms away (starts reserved
ahead), up to the part of the key the gateway may take so (``--interactive-share``). The spacing holds
for every start of the key, live and batch together; the ledger counts each start once; the batch
runs keep their order and lose nothing. The budget's step on every back-end (this process, a SQLite
file, a real redis-server: the Lua twin), then the pacers on the virtual clock (``live_sim``)."""

from __future__ import annotations

import asyncio
import bisect
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsum.pacing import Pacer, interval_of, max_starts
from batchsum.pacing.budgets.budget import ProcessBudget, Report, Share
from batchsum.pacing.budgets.gcra import LIVE_SLACK
from batchsum.pacing.pacer import _loop_time
from tests import virtual_clock
from tests.pacing import live_sim
from tests.pacing.test_pacing import engine_hooks, most_in_any_window

INTERVAL = 60.0  # a minute between starts: a busy machine's pauses between calls stay far inside it


# -- the budget's step, on every back-end --------------------------------------------------------------


def test_a_live_reservation_takes_the_next_turn_and_the_batch_start_it_took_commits_an_interval_later(users):
    """A batch run's start reserved an interval ahead; a live one reserved after it takes that same
    turn (the key's next), held for it; the batch run's commit is refused until an interval after it
    (its start handed back), the next reservations come after both, and nothing is counted until a
    start is committed. The live commit is refused only by the spacing, never by its own hold."""

    async def main():
        batch, gateway, other = users(), users(), users()
        try:
            first = await batch.reserve(INTERVAL)  # the key idle: committed at once
            assert first.committed and not first.live
            reserved = await batch.reserve(INTERVAL)  # the next turn, an interval after it
            live = await gateway.reserve(INTERVAL, live=0.5)
            assert live.live and not live.committed
            assert live.wait <= reserved.wait + 1.0  # the same turn: the key's next
            later = await other.reserve(INTERVAL)  # after the batch start handed back, not beside it
            assert later.wait > reserved.wait + INTERVAL * 1.5
            refused = await batch.commit(INTERVAL)
            assert not refused.committed and refused.wait > live.wait + INTERVAL / 2  # an interval after the live one
            spaced = await gateway.commit(INTERVAL, live=0.5)  # its own hold is no bar; the spacing is
            assert not spaced.committed and spaced.wait <= live.wait + 1.0
            look = await other.look()
            assert look.starts == 1 and look.live_open
        finally:
            for user in (batch, gateway, other):
                await user.aclose()

    asyncio.run(main())


def test_the_live_lane_takes_two_turns_at_once_then_one_every_interval_over_its_share(users):
    """``--interactive-share 0.5`` at an interval of a minute: two live reservations at once go ahead
    of the batch runs, the third waits its turn beside them (a reservation like theirs)."""

    async def main():
        gateway, batch = users(), users()
        try:
            await batch.reserve(INTERVAL)
            queued = await batch.reserve(INTERVAL)
            lanes = [await gateway.reserve(INTERVAL, live=0.5) for _ in range(3)]
            assert [slot.live for slot in lanes] == [True, True, False]
            assert lanes[0].wait <= queued.wait + 1.0  # the key's next turn
            assert lanes[2].wait > queued.wait + INTERVAL / 2  # behind the batch start queued before it
        finally:
            await gateway.aclose()
            await batch.aclose()

    asyncio.run(main())


def test_a_far_batch_reservation_is_deferred_while_a_live_lane_has_room_for_its_start(users):
    """Starts reserved ahead (a far budget's way) are never taken back: while a live lane is open with
    room for the start a batch run's reservation would get, and that start is further off than its
    answer's way back and the slack, the reservation is deferred, nothing reserved; a live one never
    is. Before any live call there is no lane, and once the lane's share is spent for that start (two
    at once, then one every interval over the share) the batch run reserves as ever."""

    async def main():
        gateway, batch = users(), users()
        try:
            alone = await batch.reserve(INTERVAL, ahead=1, lead=0.01)  # no lane yet: reserved
            assert not alone.deferred and alone.at is not None and not alone.live_open
            first = await gateway.reserve(INTERVAL, ahead=1, lead=0.01, live=0.25)
            assert first.live and first.live_open and first.at == pytest.approx(alone.at + INTERVAL, abs=0.01)
            deferred = await batch.reserve(INTERVAL, ahead=1, lead=0.01)  # the lane has room for the next
            assert deferred.deferred and deferred.at is None and deferred.live_open
            assert INTERVAL < deferred.wait <= 2 * INTERVAL  # asked again just before that start
            second = await gateway.reserve(INTERVAL, ahead=1, lead=0.01, live=0.25)  # so it takes it
            assert second.live and second.at == pytest.approx(first.at + INTERVAL, abs=0.01)
            reserved = await batch.reserve(INTERVAL, ahead=1, lead=0.01)  # the lane's next is 4 minutes on
            assert not reserved.deferred and reserved.at == pytest.approx(second.at + INTERVAL, abs=0.01)
            assert (await batch.look()).starts == 0  # starts reserved ahead are counted once told
        finally:
            await gateway.aclose()
            await batch.aclose()

    asyncio.run(main())


def test_far_batch_runs_told_to_wait_for_the_lane_take_the_next_starts_in_the_order_told(users):
    """While the lane is open the first far batch run told to wait has the key's next start kept for it:
    another that asks within its own (longer) way back of that start, which would have taken it, is
    told to wait one more interval, queued behind it. Once the first takes its start the second is
    first in the queue and keeps its place when a live request takes the start after (the lane goes
    first); a third waits behind it. The same on every back-end."""

    async def main():
        gateway, first, second, third = users(), users(), users(), users()
        a, b, c = (Report(asker=name) for name in ("a", "b", "c"))
        far = INTERVAL + 1.0  # a way back that reaches the next start: granted at once, but for the queue
        try:
            opened = await gateway.reserve(INTERVAL, ahead=1, lead=0.01, live=0.25)
            assert opened.live and opened.live_open and opened.at is not None
            told = await first.reserve(INTERVAL, a, ahead=1, lead=0.01)  # the lane has room: asked to wait
            assert told.deferred and told.live_open
            kept = await second.reserve(INTERVAL, b, ahead=1, lead=far)  # the next start is a's
            assert kept.deferred and kept.wait + far > told.wait + 0.01 + INTERVAL / 2  # for the start after
            mine = await first.reserve(INTERVAL, a, ahead=1, lead=far)
            assert not mine.deferred and mine.at is not None  # the key's next start (its way back's reach, at least)
            assert opened.at + INTERVAL - 0.01 <= mine.at < opened.at + 2 * INTERVAL - 10
            assert (await third.reserve(INTERVAL, c, ahead=1, lead=far)).deferred  # b's turn before c's
            live = await gateway.reserve(INTERVAL, ahead=1, lead=0.01, live=0.25)  # the lane's second at once
            assert live.live and live.at == pytest.approx(mine.at + INTERVAL, abs=1.0)
            yours = await second.reserve(INTERVAL, b, ahead=1, lead=far)  # the lane's room spent: b's turn
            assert not yours.deferred and yours.at == pytest.approx(live.at + INTERVAL, abs=1.0)
            theirs = await third.reserve(INTERVAL, c, ahead=1, lead=far)  # first now; the lane's room is back then
            assert theirs.deferred and theirs.wait + far == pytest.approx(yours.wait + INTERVAL, abs=1.0)
        finally:
            for user in (gateway, first, second, third):
                await user.aclose()

    asyncio.run(main())


# -- the pacers, on the virtual clock -------------------------------------------------------------------


def _checked(lane: live_sim.Lane, rpm: float, far: bool, total: int) -> None:
    """What holds in every simulation: every start of the key (live and batch) kept the spacing (on
    this machine's budget exactly, each committed an interval after the last; a far one's as its
    reservations, seen through the budget's jitter), no 429 from a strict 10 s window at the plan,
    each start counted once by the ledger, each batch run's starts in its requests' order, and no
    start reserved ahead lost."""
    interval = interval_of(rpm)
    assert len(lane.starts) == lane.told == lane.counted == total  # nothing counted twice or lost, or late
    if not far:
        assert min(b - a for a, b in zip(lane.starts, lane.starts[1:])) >= interval - 1e-9
    for width in (1.0, 10.0):
        assert most_in_any_window(lane.starts, width) <= max_starts(rpm, width) + far, width
    assert lane.refused == 0
    for run in lane.batch:
        assert all(a < b for a, b in zip(run, run[1:]))  # the run's order kept
    assert lane.lost == 0


# A live request on a far budget needs its own round trip and way back before it can start, and may
# find the key's next start held by a batch run that reserved it just in time: within this of arriving.
FAR_REACH = 2 * (live_sim.RTT + 2 * live_sim.JITTER) + LIVE_SLACK


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    far=st.booleans(),
    rpm=st.sampled_from([300, 600, 1200]),
    runs=st.integers(1, 3),
    share=st.sampled_from([0.25, 0.5, 1.0]),
    gaps=st.lists(st.floats(0.0, 3.0), min_size=2, max_size=10),
)
def test_a_live_request_takes_the_keys_next_turn_ahead_of_every_batch_runs_reserved_start(far, rpm, runs, share, gaps):
    """Batch runs keep the key busy; live requests arrive with gaps hypothesis chooses (each at least
    the lane's own interval after the one before: every one has room). On this machine's budget each
    starts within one interval of its arrival, and no batch start comes between its arrival and its
    start; on a far one, within the interval and its reach (its own call, a start a batch run held
    just in time). The first on a far budget opens the lane (before it, each batch run held its next
    start reserved ahead): it waits for those too."""
    interval = interval_of(rpm)
    live_at = [1.0 + sum(gaps[: i + 1]) + i * interval / share for i in range(len(gaps))]
    each = math.ceil((live_at[-1] + 3.0) * rpm / 60 / runs)
    lane = live_sim.simulate(rpm, runs=runs, each=each, live_at=live_at, share=share, far=far)
    _checked(lane, rpm, far, runs * each + len(live_at))
    batch = lane.batch_starts()
    for n, (arrival, start) in enumerate(lane.live):
        reach = (FAR_REACH + (runs * interval if n == 0 else 0.0)) if far else 0.0
        assert start - arrival <= interval + reach + 1e-9, (n, start - arrival)
        between = bisect.bisect_left(batch, start) - bisect.bisect_right(batch, arrival + reach)
        assert between <= 0, (n, between)


@pytest.mark.parametrize("far", [False, True])
def test_the_batch_runs_lose_no_time_to_the_live_lane(far):
    """A batch run at 600/min and a live request every 2 s: the key is used as fully as without the
    lane (every start an interval after the last, live or batch), and each live request waits less
    than an interval on this machine's budget (within its reach, 20 ms away)."""
    rpm = 600
    live_at = [1.0 + 2.037 * k for k in range(15)]
    lane = live_sim.simulate(rpm, each=300, live_at=live_at, far=far)
    _checked(lane, rpm, far, 315)
    interval = interval_of(rpm)
    assert lane.starts[-1] - lane.starts[0] <= (len(lane.starts) - 1) * interval + (2 * FAR_REACH if far else 1e-6)
    assert max(lane.waits()[1:]) <= interval + (FAR_REACH if far else 1e-9)


@pytest.mark.parametrize("far", [False, True])
@pytest.mark.parametrize("share", [0.0, 0.1, 0.25, 0.5, 1.0])
def test_a_storm_of_live_requests_leaves_the_batch_run_its_turn_beside_them(far, share):
    """A gateway offered 1200/min of live requests beside a batch run, at 600/min: the live lane takes
    at most its share of the key ahead of the run, and its other requests wait their turn beside the
    run's, so the run keeps at least (1 - share) / 2 of the key (all of it goes to the lane at a share
    of 1; half at 0, no lane at all). The spacing, the ledger and the run's order hold throughout."""
    rpm = 600
    live_at = [0.05 * k for k in range(600)]
    lane = live_sim.simulate(rpm, each=600, live_at=live_at, share=share, far=far)
    _checked(lane, rpm, far, 1200)
    batch = sum(5 <= t < 30 for t in lane.batch_starts())
    live = sum(5 <= start < 30 for _, start in lane.live)
    part = batch / (batch + live)
    assert part >= (1 - share) / 2 - 0.03, part
    if share == 1.0:
        assert part == 0.0  # live always first: the run waits for the storm to pass


def test_a_live_start_held_for_a_request_that_gave_up_costs_the_batch_one_turn_and_counts_nothing():
    """On this machine's budget a live reservation holds the key's next start for its request; a
    request cancelled while it waits (its client gone, its deadline past) leaves the hold to lapse:
    the batch run's next start goes an interval after the held one (one turn unused), and the budget
    counts no start for it."""
    inner = ProcessBudget(_loop_time, shared=True)
    batch, gateway = Pacer(600, budget=inner), Pacer(600, budget=inner, live=0.25)
    starts: list[float] = []

    async def main():
        gate = engine_hooks(batch)

        async def one():
            ticket = await gate.before_attempt()
            starts.append(ticket[1])
            await asyncio.sleep(0.3)
            gate.after_attempt(ticket, None, None)

        sent = [asyncio.ensure_future(one()) for _ in range(30)]
        await asyncio.sleep(1.05)
        given_up = asyncio.ensure_future(gateway.before_attempt())
        await asyncio.sleep(0.01)  # reserved, waiting for its turn
        given_up.cancel()
        await asyncio.gather(*sent)
        await batch.flush()
        return sum((await inner.ledger(600.0)).starts)

    counted = virtual_clock.run(main())
    interval = interval_of(600)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert counted == len(starts) == 30
    assert min(gaps) >= interval - 1e-9 and sorted(gaps)[-1] <= 2 * interval + 1e-9
    assert sum(gap > 1.5 * interval for gap in gaps) == 1  # the one turn the hold kept


@pytest.mark.parametrize("share", [None, 0.5])
def test_a_late_requests_retry_after_counts_the_live_turn(share):
    """What a gateway's late request is told (``Pacer.turn_in``): beside a busy batch run, its first
    turn is the key's next (within an interval), and the requests behind it one each at the lane's
    part of the key (its share, beside a run that takes the rest); with a ``--share`` of its own, one
    each at that share's interval."""
    inner = ProcessBudget(_loop_time, shared=True)
    own = None if share is None else Share("gateway", share)  # the gateway's --share: its own interval
    batch, gateway = Pacer(600, budget=inner), Pacer(600, budget=inner, live=0.25, share=own)

    async def main():
        gate, live_gate = engine_hooks(batch), engine_hooks(gateway)

        async def one(through):
            ticket = await through.before_attempt()
            await asyncio.sleep(0.3)
            through.after_attempt(ticket, None, None)

        sent = [asyncio.ensure_future(one(gate)) for _ in range(100)]
        await asyncio.sleep(2.0)
        await one(live_gate)
        await asyncio.sleep(1.0)
        told = gateway.turn_in(1), gateway.turn_in(3)
        await asyncio.gather(*sent)
        return told

    first, third = virtual_clock.run(main())
    interval = interval_of(600)
    if share is None:
        assert first <= interval + 1e-9
        assert third == pytest.approx(first + 2 * interval / 0.25)
    else:  # its share's interval is its part of the key already: not divided by its part again
        assert first <= interval / share + 1e-9
        assert third == pytest.approx(first + 2 * interval / share)


def test_a_far_batch_run_reserves_one_start_at_a_time_while_the_lane_is_open():
    """At 6000/min 20 ms away a far batch run would reserve several starts in one call (enough for two
    round trips); while a live lane is open it reserves each alone, just in time, so a live request
    still finds the key's next start free (within the interval and its reach)."""
    rpm = 6000
    live_at = [1.0 + 0.537 * k for k in range(10)]
    lane = live_sim.simulate(rpm, each=700, live_at=live_at, far=True)
    _checked(lane, rpm, True, 710)
    assert max(lane.waits()[1:]) <= interval_of(rpm) + FAR_REACH


@pytest.mark.parametrize("rtts", [(0.02, 0.02), (0.04, 0.002), (0.04, 0.002, 0.02)])
def test_far_batch_runs_told_to_wait_for_the_lane_take_the_keys_starts_in_turn(rtts):
    """Far batch runs beside a live request every 2 s, each at its own distance from the budget: the
    run whose calls land soonest does not take every start (the budget keeps the next start for the
    run it told to wait, then the next for the next one told): each run's part of the batch starts
    is within a tenth of an even one, the key used as fully, no start lost."""
    rpm, runs = 600, len(rtts)
    live_at = [1.0 + 2.0 * k for k in range(15)]
    lane = live_sim.simulate(rpm, runs=runs, each=600 // runs, live_at=live_at, far=True, rtts=rtts)
    _checked(lane, rpm, True, 600 + len(live_at))
    parts = [sum(5 <= t < 25 for t in run) for run in lane.batch]
    assert min(parts) >= (1 / runs - 0.1) * sum(parts), parts
