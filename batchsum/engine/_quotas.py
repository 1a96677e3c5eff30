"""What an attempt does with its key's quotas (``Quotas``): admitted (counted on a configured quota,
reserved on a stated one, or the key leaves the run: ``KeyOut``), the count of an attempt not billed
given back (``tally.charge``), and what each answer says of them (room stated, a quota spent: the
key out until its reset)."""

from __future__ import annotations

import asyncio

from ..pacing.budgets.quota import LONG_RETRY_AFTER, Spent
from ..service.errors import RateLimitError
from ..service.rate_headers import RateStatement
from ._keys import KeyOut, Keys, LaneState, wall_of

__all__ = ["Quotas"]

# How often an attempt waiting for its key's answers looks again: the answers it waits for may be
# another batch's on the same key (the calls of one open run, from DuckDB's threads), which tell
# their own batch, not this one.
LOOK_AGAIN_SECONDS = 0.5


class Quotas:
    """The quotas of a batch's keys (``keys``), as its gate meets them."""

    __slots__ = ("keys",)

    def __init__(self, keys: Keys) -> None:
        self.keys = keys

    def started(self) -> None:
        if not self.keys.single:
            self.keys.changed()

    async def admit(self, state: LaneState) -> tuple[str, ...] | None:
        """The key's quotas let this attempt go: it is counted on the key's budget, held to a
        configured quota (the periods to give it back by), and reserved on a stated one; ``KeyOut``
        when the key is out or spent."""
        lane, keys = state.lane, self.keys
        while True:
            now = lane.pacer.now()
            if state.out(now):
                raise KeyOut
            if lane.stated.allows(now, state.reserved):
                break
            if _none_left(state, now):
                if lane.stated.until - now <= LONG_RETRY_AFTER:  # back within a minute or two: a pause
                    await state.guard(asyncio.sleep(lane.stated.until - now))
                    continue
                keys.take_out(state, lane.stated.until, lane.stated.spent())
                raise KeyOut
            state.answered.clear()  # answers on the wire may state more room, or none left
            await _next_answer(state)
        counted = lane.counted
        if counted is None:
            state.reserved += 1
            return None
        while True:
            returned = counted.returned
            period = await counted.claim()
            if period is not None:
                state.reserved += 1
                return period
            # Refused: spent, unless a claim of the run's (any batch's on the key) may still be given
            # back. Wait until one is, or none is pending; a count given back meanwhile: claim again.
            while counted.returned == returned and counted.pending:
                await state.guard(counted.moved(LOOK_AGAIN_SECONDS))
                if state.out(lane.pacer.now()):
                    raise KeyOut
            if counted.returned == returned:
                spent = counted.spent()
                until = lane.pacer.now() + max(1.0, spent.until - wall_of(lane))
                keys.take_out(state, until, spent, remember=False)  # the budget's count says it to every run
                raise KeyOut

    def release(self, state: LaneState, period: tuple[str, ...] | None) -> None:
        """An admitted attempt that never started: its reservation freed and its count given back;
        the key's waiting attempts look again, and a stated quota it leaves with no room takes the key
        out (no answer may come to do it)."""
        state.reserved -= 1
        self.settle(state, period, paid=False)
        state.answered.set()
        self._out_if_spent(state)

    def _out_if_spent(self, state: LaneState) -> None:
        """A stated quota with no room left and nothing of the key's under way to state more: the key
        out until its reset (one within a minute or two is a pause: its starts wait, it stays)."""
        lane = state.lane
        now = lane.pacer.now()
        if not state.out(now) and _none_left(state, now) and lane.stated.until - now > LONG_RETRY_AFTER:
            self.keys.take_out(state, lane.stated.until, lane.stated.spent())

    def settle(self, state: LaneState, period: tuple[str, ...] | None, *, paid: bool) -> None:
        """An admitted attempt is done with its count on the key's budget (``period``: None when it
        had none): paid, it stays; not billed (a 429, a 401, a 422, a 5xx) or never started, it is
        given back, in a task of its own (the attempt's end does not wait for it)."""
        counted = state.lane.counted
        if period is not None and counted is not None:
            counted.settle(period, paid=paid)

    async def close(self) -> None:
        """Wait for the give-backs under way: done before the run ends and its budgets close."""
        for state in self.keys.states:
            if state.lane.counted is not None:
                await state.lane.counted.close()

    def learn(
        self,
        state: LaneState,
        error: BaseException | None,
        limits: RateStatement | None,
        started: float,
        quota_429: bool,
    ) -> None:
        """What an answer says of the key's quotas: a quota stated (its room), or spent."""
        lane, keys = state.lane, self.keys
        now = lane.pacer.now()
        if isinstance(error, RateLimitError):
            lane.rate_limited += 1
        if limits is not None and (limits.quota is not None or limits.quota_room):
            lane.stated.stated(
                limits.quota_remaining, limits.quota_reset, limits.quota, limits.quota_window, started, now
            )
            if lane.stated.news and lane.record is not None and lane.stated.lasts(now):
                lane.record.quota_stated(lane.stated)
        state.answered.set()
        if quota_429:  # a quota spent (remembered), or a wait longer than max_wait (the same stop)
            assert limits is not None and limits.retry_after is not None
            wait, lasting = limits.retry_after, limits.retry_after > LONG_RETRY_AFTER
            beyond = "" if lasting else f", longer than max_wait ({keys.max_wait:g} s)"
            name = f"quota (the service answered 429 asking to wait {_duration(wait)}{beyond})"
            if lane.stated.limit is not None and lane.stated.left is not None and lane.stated.left <= 0:
                name = lane.stated.spent().name
            keys.take_out(state, now + wait, Spent(name, wall_of(lane) + wait), remember=lasting)
        elif isinstance(error, RateLimitError) and limits is not None and limits.quota_room:
            # Refused on a quota it states: spent until its reset; one back within a minute or two is
            # the 429's pause (the pacer's), and the room stated (none) holds the key's next starts.
            if limits.quota_remaining == 0 and limits.quota_reset is not None and limits.quota_reset > LONG_RETRY_AFTER:
                keys.take_out(state, now + limits.quota_reset, lane.stated.spent())
        # A 200 saying none is left, with none of ours on the wire: no request of this key is admitted
        # again to find it spent (its capacity is nil), so the answer takes the key out itself.
        self._out_if_spent(state)
        keys.changed()


def _none_left(state: LaneState, now: float) -> bool:
    """The key's stated quota has no room for another start, and nothing of the key's is admitted or
    on the wire whose answer could state more."""
    lane = state.lane
    return not lane.stated.allows(now, state.reserved) and not state.reserved and not lane.pacer.in_flight.on_wire


def _duration(seconds: float) -> str:
    """``a day``, ``2 hours``, ``30 minutes``, ``45 s``: a wait as a person reads it."""
    for size, one in ((86_400, "day"), (3600, "hour"), (60, "minute")):
        if seconds >= size:
            count = seconds / size
            return f"a {one}" if round(count, 1) == 1 else f"{count:.3g} {one}s"
    return f"{seconds:g} s"


async def _next_answer(state: LaneState) -> None:
    """Until an answer of the key's comes to this batch, or ``LOOK_AGAIN_SECONDS`` (``KeyOut`` if
    the key leaves the run first)."""
    try:
        await state.guard(asyncio.wait_for(state.answered.wait(), LOOK_AGAIN_SECONDS))
    except asyncio.TimeoutError:
        pass
