"""The gate every attempt passes (``Gate``; ``LaneHooks``, the client's attempt hooks for one key):
the request cap's count, the key's quotas, a slot in flight, the key's pacer's turn; what each answer
says of the key (a quota stated or spent); and what a stop must know: the tasks on the wire, nothing
new starts."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from ..pacing import Pacer
from ..pacing.budgets.quota import LONG_RETRY_AFTER
from ..pacing.pacer import AtTurn
from ..service.errors import (
    APIError,
    APIResponseValidationError,
    APIStatusError,
    JobStopped,
    RateLimitError,
    RequestCapReached,
)
from ..service.rate_headers import MINUTE_BOUND, RateStatement
from ..service.settings import DEFAULT_MAX_WAIT
from ._keys import KeyOut, Keys, LaneState
from ._quotas import Quotas
from .tally import BatchStats, charge

__all__ = ["Gate", "LaneHooks", "RequestCap"]


class Gate:
    """What every attempt of a batch passes, on whichever key (``hooks`` gives the client a key's):
    the request cap's count, the key's quotas, a slot in flight, then the key's pacer's turn; and what
    the engine must know when it stops: which tasks have a request on the wire, and that nothing new
    starts.

    The cap counts paid requests (``RequestCap``, paid as ``tally.charge`` says); a key's quotas are
    ``_quotas.Quotas``'s."""

    __slots__ = (
        "max_wait",
        "closing",
        "on_wire",
        "_ids",
        "stats",
        "cap",
        "quotas",
    )

    def __init__(
        self,
        keys: Keys,
        max_wait: float = DEFAULT_MAX_WAIT,
        *,
        stats: BatchStats | None = None,
        cap: int | None = None,
        on_cap: Callable[[RequestCapReached], None] | None = None,
    ) -> None:
        self.max_wait = max_wait
        self.closing = False
        self.on_wire: set[asyncio.Task[Any]] = set()
        self._ids = itertools.count()
        self.stats = stats
        self.cap = RequestCap(cap, on_cap, self) if cap is not None else None
        self.quotas = Quotas(keys)  # the batch's keys, and their quotas

    def hooks(self, state: LaneState, first_429: float | None = None, at_turn: AtTurn | None = None) -> LaneHooks:
        """The client's attempt hooks for one key of the batch (the gate's, with that key's pacer);
        ``first_429``: when the request met its first 429, on a key it was sent on before;
        ``at_turn``: asked at each attempt's turn whether it still goes (the pacer's ``TurnGiven``
        when it does not: what it took here is given back, as for any attempt that does not start)."""
        return LaneHooks(self, state, first_429, at_turn)

    async def _before(
        self, state: LaneState, at_turn: AtTurn | None = None
    ) -> tuple[int, float, asyncio.Task[Any] | None, Any]:
        if self.closing:
            raise asyncio.CancelledError
        pacer = state.lane.pacer
        _job_stopped(pacer)
        if self.cap is not None:
            await self.cap.claim()
        period: tuple[str, ...] | None = None
        admitted = False
        try:
            period = await self.quotas.admit(state)
            admitted = True
            in_flight = pacer.in_flight
            await state.guard(in_flight.acquire())
            try:
                started = await state.guard(pacer.before_attempt(at_turn))
                if self.closing:
                    raise asyncio.CancelledError
                _job_stopped(pacer)  # heard during the turn: its start goes nowhere
                # The key left the run while this waited, or an answer since says its quota has no room.
                if state.out(started) or not state.lane.stated.allows(started):
                    raise KeyOut
            except BaseException:
                in_flight.release()
                raise
        except BaseException:
            if self.cap is not None:
                self.cap.settle(paid=False)
            if admitted:
                self.quotas.release(state, period)
            raise
        attempt, task = next(self._ids), asyncio.current_task()
        in_flight.started(attempt, started)
        state.reserved -= 1
        state.lane.stated.started(started)
        state.lane.requests += 1
        state.started(started)
        self.quotas.started()  # a key's queue moved: requests waiting for a key may go now
        if task is not None:
            self.on_wire.add(task)
        if self.stats is not None:
            self.stats.attempt_started(self._wire(state))
        return attempt, started, task, period

    def _after(
        self,
        state: LaneState,
        ticket: tuple[int, float, asyncio.Task[Any] | None, Any],
        error: BaseException | None,
        limits: RateStatement | None,
    ) -> None:
        attempt, started, task, period = ticket
        pacer = state.lane.pacer
        if task is not None:
            self.on_wire.discard(task)
        # An answer of any kind says how long the service takes; a timeout or a lost connection does not.
        answered = error is None or isinstance(error, (APIStatusError, APIResponseValidationError))
        pacer.in_flight.finished(attempt, answered)
        refused = isinstance(error, RateLimitError)
        cost = charge(error)
        if self.cap is not None:
            self.cap.settle(paid=cost.paid)
        self.quotas.settle(state, period, paid=cost.paid)  # not billed (a 429, a 401, a 422, a 5xx): given back
        if self.stats is not None:
            latency = pacer.now() - started if answered else None
            self.stats.attempt_ended(_outcome(error), latency, self._wire(state), cost)
        quota = refused and limits is not None and _stops(limits.retry_after, self.max_wait)
        self.quotas.learn(state, error, limits, started, quota)
        pacer.after_attempt(
            started,
            rate_limited=refused and not quota,
            retry_after=error.retry_after if isinstance(error, RateLimitError) else None,
            answered=answered and not quota,
            headers=limits,
        )

    def _wire(self, state: LaneState) -> int:
        """Attempts on the wire: the key's, or over several keys every key's."""
        keys = self.quotas.keys
        if keys.single:
            return state.lane.pacer.in_flight.on_wire
        return sum(s.lane.pacer.in_flight.on_wire for s in keys.states)


class RequestCap:
    """The request cap (``max_requests``) as paid requests claimed: one before each attempt waits for
    its turn, given back when its answer shows it was not billed (``tally.charge``: a 429, a 401, a
    422, a 5xx; a lost answer keeps it, as it may have been). Used up, an attempt waits while claimed
    attempts may still give one back; when none can, ``on_cap`` stops the batch.

    Invariant: ``paid`` never passes ``cap``, so the attempts billed never do either."""

    __slots__ = ("cap", "on_cap", "gate", "paid", "claims", "_settled")

    def __init__(self, cap: int, on_cap: Callable[[RequestCapReached], None] | None, gate: Gate) -> None:
        self.cap = cap
        self.on_cap = on_cap
        self.gate = gate
        self.paid = 0  # paid requests claimed (started or about to start), those not billed given back
        self.claims = 0  # claims whose attempt has not ended yet: each may still give one back
        self._settled: asyncio.Event | None = None

    async def claim(self) -> None:
        while self.paid >= self.cap:
            if self.gate.closing:
                raise asyncio.CancelledError
            if not self.claims:
                if self.on_cap is not None:
                    self.on_cap(RequestCapReached(self.cap))
                raise asyncio.CancelledError
            if self._settled is None:
                self._settled = asyncio.Event()
            self._settled.clear()
            await self._settled.wait()
        self.paid += 1
        self.claims += 1

    def settle(self, paid: bool) -> None:
        self.claims -= 1
        if not paid:
            self.paid -= 1
        if self._settled is not None:
            self._settled.set()


class LaneHooks:
    """The client's attempt hooks for one key: the batch's gate with that key's pacer and quotas;
    ``first_429``, the request's patience, carried over from a key it was sent on before."""

    __slots__ = ("gate", "state", "max_wait", "first_429", "at_turn")

    def __init__(
        self, gate: Gate, state: LaneState, first_429: float | None = None, at_turn: AtTurn | None = None
    ) -> None:
        self.gate = gate
        self.state = state
        self.max_wait = gate.max_wait
        self.first_429 = first_429
        self.at_turn = at_turn

    async def before_attempt(self) -> tuple[int, float, asyncio.Task[Any] | None, Any]:
        return await self.gate._before(self.state, self.at_turn)

    def after_attempt(
        self, ticket: tuple[int, float, asyncio.Task[Any] | None, Any], error: BaseException | None, limits: Any
    ) -> None:
        self.gate._after(self.state, ticket, error, limits)


def _job_stopped(pacer: Pacer) -> None:
    """Its run's job was stopped (a driver posted it on the key's budget, and the pacer heard it):
    ``JobStopped``, which stops the batch as any stop does (``_requests``)."""
    if pacer.job_stop is not None:
        raise JobStopped(
            f"the job was stopped by its driver ({pacer.job_stop}): nothing new was sent, the answers on the wire "
            "were awaited and kept; the same job again sends only the rest"
        )


def _stops(retry_after: float | None, max_wait: float) -> bool:
    """A 429 that takes its key out until its ``Retry-After`` (and, with every key out, stops the
    run) rather than pausing it: one asking for longer than a per-minute limit ever does (a quota
    spent), or for over a minute and longer than ``max_wait`` (the same stop, not a wait). Shorter,
    it is a per-minute "later", and each row's patience (``max_wait``) bounds it."""
    wait = retry_after or 0.0
    return wait > LONG_RETRY_AFTER or (wait > MINUTE_BOUND and wait > max_wait)


def _outcome(error: BaseException | None) -> str:
    """An attempt's outcome, as the report and the metrics name it."""
    if error is None:
        return "ok"
    if isinstance(error, RateLimitError):
        return "rate_limited"
    if isinstance(error, APIError):
        return error.code
    return "cancelled"
