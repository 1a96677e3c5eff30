"""A key's budget that cannot be reached mid-run (a Redis restarting, a budget file locked or on a full
disk): a pause, never a local pace. Every call waits it out with a backoff, up to the run's
``budget_wait``; the state a progress line shows says since when.

Invariant: while a budget is out, nothing is reserved on it, so nothing starts on it (a start
reserved before the outage keeps its place); a run stops only once the outage is older than its
``budget_wait``, and a budget not armed for a run (the check before anything is sent, a dry run,
``batchsum limits``) fails at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from ...service.errors import BudgetError
from ...service.retry import backoff

__all__ = ["Outage", "BudgetUnreachable", "hurried", "MAX_PROBE_SECONDS", "GIVE_UP_PROBE"]

T = TypeVar("T")

MAX_PROBE_SECONDS = 2.0  # an out budget is tried again at least this often (a backoff from 0.5 s, jittered)
GIVE_UP_PROBE = 1.0  # past a run's patience, the budget is tried at most this often; other calls fail at once

_HURRIED: contextvars.ContextVar[bool] = contextvars.ContextVar("batchsum_budget_hurried", default=False)


class BudgetUnreachable(BudgetError):
    """The budget did not answer this time (a connection refused or lost, a file locked or full):
    waited out while a run is armed, else the one-line error it always was. ``state``: what the
    outage line says of it (``unreachable``, ``locked``, ``on a full disk``); ``cause``: what its
    library said; ``advice``: what to do about it."""

    def __init__(self, message: str, state: str = "unreachable", cause: str = "", advice: str = "") -> None:
        super().__init__(message)
        self.state, self.cause, self.advice = state, cause, advice


@contextlib.contextmanager
def hurried() -> Iterator[None]:
    """Calls made inside wait out no outage: a run's last words to its budget (its counts, its lead
    let go) are not worth its ``budget_wait``."""
    token = _HURRIED.set(True)
    try:
        yield
    finally:
        _HURRIED.reset(token)


class Outage:
    """One budget's outage, if any: since when (``since``, on ``clock``, by default the running event
    loop's; ``since_wall``, for people),
    what it is (``state``), and how long a run waits for it (``patience``: 0 until a run arms it)."""

    __slots__ = (
        "where",
        "patience",
        "since",
        "since_wall",
        "state",
        "said",
        "ended",
        "_clock",
        "_probes",
        "_last",
        "_tried",
    )

    def __init__(self, where: str, clock: Callable[[], float] | None = None) -> None:
        self.where = where
        self.patience = 0.0
        self.since: float | None = None
        self.since_wall = 0.0
        self.state = "unreachable"
        self.said = ""  # what the budget's library last said of it (redacted)
        self.ended = 0  # outages that ended: the budget answered again
        self._clock = clock or _loop_time
        self._probes = 0
        self._last: BudgetUnreachable | None = None  # the outage's last failure
        self._tried = -float("inf")  # when the budget was last tried during the outage

    def arm(self, patience: float) -> None:
        """A run waits up to ``patience`` seconds for the budget to answer again before it stops."""
        self.patience = max(0.0, patience)

    async def through(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call``'s answer; while the budget is out (``BudgetUnreachable``), tried again with a
        backoff until the outage is ``patience`` old: then ``BudgetError`` (the run stops). Once it
        is that old, or for a call that may not wait (``hurried``), the budget is tried at most once
        a ``GIVE_UP_PROBE`` seconds: the other calls fail at once (a run stopping gives back counts
        and says goodbye: each would otherwise try it again)."""
        while True:
            if self.since is not None and self._last is not None and self._given_up(self._clock()):
                raise self._gone(self._last)
            try:
                answer = await call()
            except BudgetUnreachable as exc:
                now = self._clock()
                if self.since is None:
                    self.since, self.since_wall, self._probes = now, time.time(), 0
                self.state, self.said, self._last, self._tried = exc.state, str(exc), exc, now
                left = self.since + self.patience - now
                if left <= 0 or not self.patience or _HURRIED.get():
                    raise self._gone(exc) from None
                self._probes += 1
                await asyncio.sleep(min(left, backoff(self._probes), MAX_PROBE_SECONDS))
                continue
            if self.since is not None:
                self.since, self._last = None, None
                self.ended += 1
            return answer

    def _given_up(self, now: float) -> bool:
        """Whether a call now fails without trying the budget: it was tried less than
        ``GIVE_UP_PROBE`` ago, and the outage is past the run's patience (or the call may not wait)."""
        past = not self.patience or now >= (self.since or now) + self.patience or _HURRIED.get()
        return past and now - self._tried < GIVE_UP_PROBE

    def _gone(self, exc: BudgetUnreachable) -> BudgetError:
        if not self.patience or self.since is None:
            return BudgetError(str(exc))  # not a run's budget: the one line it always was
        cause = f"; {exc.cause}" if exc.cause else ""
        advice = f"; {exc.advice}" if exc.advice else ""
        return BudgetError(
            f"the rate budget at {self.where} has been {self.state} since {_clock_time(self.since_wall)}, longer than "
            f"--budget-wait ({self.patience:g} s{cause}){advice}"
        )

    def describe(self) -> str | None:
        """``waiting for the rate budget at redis://HOST:PORT/0, unreachable since 14:02:11`` (None: it answers)."""
        if self.since is None:
            return None
        return f"waiting for the rate budget at {self.where}, {self.state} since {_clock_time(self.since_wall)}"


def _loop_time() -> float:
    """The running event loop's clock (the pacer's; a virtual one in tests), else the monotonic clock."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


def _clock_time(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall))
