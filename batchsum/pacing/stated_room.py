"""Room a service states in its answers' headers (``RateLimit-Remaining`` until ``-Reset``, and the
like): the one exception to the spacing rule, and who may spend it.

Invariants: starts on stated room never outnumber what the service stated, less what of ours it may
not have counted yet; they are never closer than the plan's interval divided by ``ROOM_SPEEDUP`` (so a
429 comes back before much more is sent); once the room is used up nothing starts before its reset;
a 429 while room is stated makes every statement untrusted for the rest of the run (and the key's
record remembers it: see ``auto/key_record.py``); only a run alone on its budget, with the whole key, spends it.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from typing import Protocol

from ..service.retry import MAX_RETRY_AFTER
from .budgets.exchange import Slot
from .budgets.spacing import WINDOW

__all__ = ["StatedRoom", "Company", "Statement"]

ROOM_SLACK = 0.25  # our starts this long before a stating request may have reached the service after it
ALONE_AFTER = WINDOW  # another user of the budget seen this recently: the stated room is not ours alone
OTHERS_SLACK = 0.002  # a reserved start this much later than our own schedule puts it is someone else's


class Statement(Protocol):
    """What an answer's rate-limit headers state (``rate_headers.RateStatement``)."""

    @property
    def per_minute(self) -> float | None: ...

    @property
    def remaining(self) -> int | None: ...

    @property
    def reset(self) -> float | None: ...


class StatedRoom:
    """Room the service's headers last stated: ``count`` more starts before ``until`` (our clock: the
    stating attempt's start plus the reset, the earliest the window can have moved); when it is used
    up, nothing starts before ``reset_at`` (the answer's arrival plus the reset, the latest).
    ``trusted``: False once a 429 contradicted a statement (or the key's record says one did).
    ``spent_at``: the start times of the last two minutes' starts on stated room."""

    __slots__ = ("count", "until", "reset_at", "trusted", "contradicted", "spent_at")

    def __init__(self, trusted: bool = True) -> None:
        self.trusted = trusted
        self.contradicted = False  # a 429 contradicted a statement in this run
        self.spent_at: deque[float] = deque()
        self.forget()

    def forget(self) -> None:
        """No room stated (or none trusted any more)."""
        self.count = 0
        self.until = -math.inf
        self.reset_at = -math.inf

    def note(
        self, statement: Statement, started_at: float, now: float, starts: list[float], wire: Iterable[float]
    ) -> bool:
        """The room stated by the answer to the attempt that started at ``started_at``: ``remaining``
        until ``reset``, less what of ours the service may not have counted yet (of our ``starts``,
        those since a little before that attempt's, and what of ours was on the wire from before it,
        started at ``wire``). Each such figure is at most the room there is; the largest one still
        valid is kept (answers to requests sent together arrive in any order, and the one that
        counted the most of them leaves the most room once they are taken off). Whether it is newly
        kept with room left (a turn waiting for the reset may go now). Nothing, once untrusted."""
        if not self.trusted or statement.remaining is None or statement.reset is None:
            return False
        since = started_at - ROOM_SLACK
        later = len(starts) - bisect.bisect_left(starts, since) - 1  # less the stating attempt itself
        on_wire = sum(1 for t in wire if t < since)
        left = statement.remaining - max(0, later) - on_wire
        if now < self.until and self.count >= left:
            return False
        self.count, self.until = left, started_at + statement.reset
        self.reset_at = now + min(statement.reset, MAX_RETRY_AFTER)
        return left > 0

    def refused(self, now: float) -> bool:
        """A 429 came at ``now``: if the service had stated room left, its statements are not to be
        believed again (whether that is news). Any room noted is dropped either way."""
        stated = self.left(now) > 0
        self.forget()
        if stated:
            self.trusted = False
            self.contradicted = True
            return True
        return False

    def left(self, now: float) -> int:
        """Starts still stated before the reset (0: none stated, used up, expired or untrusted)."""
        return self.count if self.trusted and self.count > 0 and now < self.until else 0

    def used(self, now: float) -> None:
        if now < self.until:
            self.count -= 1

    def spent(self, now: float) -> None:
        """A start went out on stated room at ``now`` (a 429 for it says the room was not there)."""
        self.spent_at.append(now)
        while self.spent_at[0] < now - 2 * WINDOW:
            self.spent_at.popleft()

    def reset_wait(self, now: float) -> float:
        """How long nothing more starts: until the reset, once the room is used up (0: it is not, or
        the reset is past). A newer statement of room ends the wait (our count is conservative)."""
        return max(0.0, self.reset_at - now) if self.trusted and self.count <= 0 else 0.0


class Company:
    """Whether this run is alone on its budget: no other user's starts seen in the last minute (the
    key's count of starts is more than ours), and no reservation of someone else's ahead of ours (our
    slot came later than our own schedule puts it). A private budget is always ours alone."""

    __slots__ = ("others_at", "next_due", "_shared")

    def __init__(self, shared: bool) -> None:
        self._shared = shared
        self.others_at = -math.inf  # when the budget last showed another user
        self.next_due = -math.inf  # when our own schedule puts our next start (our clock)

    def look(
        self, slot: Slot, before: float, starts: list[float], reserved: float | None = None, floor: float = -math.inf
    ) -> None:
        """Note what the budget answered at ``before``; ``reserved``: the interval of the start just
        reserved (None for a look or a commit), to compare its slot with our own schedule; ``floor``:
        the earliest our own state allows it (a pause, our last start and the interval now)."""
        if not self._shared:
            return
        # At least what it counted of ours (the start it just committed, if it did, among them).
        ours = len(starts) - bisect.bisect_left(starts, before - WINDOW - 1) + slot.committed
        due = before + slot.wait
        expected = max(before, self.next_due, floor)
        ahead = reserved is not None and not slot.deferred and due > expected + OTHERS_SLACK
        if slot.starts > ours or ahead:
            self.others_at = before
        if reserved is not None and not slot.deferred:
            self.next_due = due + reserved

    def started(self, now: float, interval: float) -> None:
        """Our start went out at ``now``: the next is due an interval after it, at the earliest."""
        self.next_due = max(self.next_due, now + interval)

    def alone(self, now: float) -> bool:
        return not self._shared or now - self.others_at > ALONE_AFTER
