"""What the service has shown of its limit, and what AIMD concludes from it: the pace is lowered only
on evidence that it is too high, and climbs back while answers come back clean.

Invariants: a 429 lowers the pace only when it came after a stretch of unpaused sending at the pace
(``EVIDENCE_SECONDS``) and the service had admitted less than a minute at the pace in the minute
before; one episode never lowers it below half, nor below ``MIN_RPM``; 429s right after a pause
(a storm) and 429s for starts on stated room lower nothing; a climb never passes the ceiling.
"""

from __future__ import annotations

import bisect
import math

from .budgets.exchange import Slot
from .budgets.spacing import JITTER_MARGIN, MIN_RPM, WINDOW

__all__ = ["Evidence"]

UNDER_LIMIT = 0.98  # on evidence, the pace drops to this share of what the service admitted in a minute ...
MAX_DECREASE = 0.5  # ... but to no less than this share of what it was
FULL_MINUTE = 0.97  # a minute that admitted this share of the pace shows the pace is not too high
EVIDENCE_SECONDS = 10.0  # a 429 is evidence only after this long of unpaused sending at the pace ...
EVIDENCE_STARTS = 10  # ... and at least this many starts
RECOVER_SECONDS = 30.0  # far from any limit the service showed, the pace climbs from 0 to rpm in 30 s
APPROACH_SECONDS = 600.0  # just under one, by rpm/600 a second (a tenth of rpm a minute) ...
PROBE_SECONDS = 6000.0  # ... and above it, probing whether the limit rose, by a hundredth a minute
FORGET_SHARE = 1.05  # a minute that admitted this share of a shown limit proves it wrong


def count_between(times: list[float], since: float, before: float) -> int:
    """How many of the sorted ``times`` lie in [since, before)."""
    return bisect.bisect_left(times, before) - bisect.bisect_left(times, since)


class Evidence:
    """This process's starts and 429s of the last two minutes, how long it has been sending unpaused,
    and the limit the service showed (what it admitted in a minute when it refused more). With a
    shared budget, the key's counts (``seen``: the budget's state at the last exchange) stand in for
    this process's share of them."""

    __slots__ = ("starts", "refused", "unpaused_since", "shown_limit", "last_climb", "seen", "_shared")

    def __init__(self, shared: bool) -> None:
        self.starts: list[float] = []  # start times of the last two minutes or so, in order
        self.refused: list[float] = []  # start times of attempts answered 429, same span, sorted
        self.unpaused_since: float | None = None
        self.shown_limit: float | None = None
        self.last_climb = -math.inf
        self.seen: Slot | None = None
        self._shared = shared

    def started(self, now: float) -> None:
        if self.unpaused_since is None:
            self.unpaused_since = now
        self.starts.append(now)
        if self.starts[0] < now - 3 * WINDOW:  # forget what is older than two minutes, now and then
            del self.starts[: bisect.bisect_left(self.starts, now - 2 * WINDOW)]

    def paused(self) -> None:
        """A pause began: the next stretch of sending at the pace starts after it."""
        self.unpaused_since = None

    def refused_at(self, started_at: float, now: float, pace: float) -> bool | None:
        """Note a 429 for the attempt that started at ``started_at``; whether it came after a stretch
        of unpaused sending at ``pace`` (``stretch_before``)."""
        bisect.insort(self.refused, started_at)
        del self.refused[: bisect.bisect_left(self.refused, now - 2 * WINDOW)]
        return self.stretch_before(started_at, pace)

    def stretch_before(self, started_at: float, pace: float) -> bool | None:
        """Had we been sending unpaused at the pace for long enough (``EVIDENCE_SECONDS``) before
        ``started_at``? None: it was sent before the last pause ended."""
        since = self.unpaused_since
        if since is None or started_at < since:
            return None
        if self._shared:  # our starts are only our share of the key's: judge by time
            return started_at - since >= EVIDENCE_SECONDS
        sent = count_between(self.starts, since, started_at)
        return sent >= max(EVIDENCE_STARTS, pace * EVIDENCE_SECONDS / WINDOW)

    def admitted(self, before: float) -> int:
        """Starts in the minute before ``before`` that were not answered 429: this process's, or
        with a shared budget the key's as a whole (as of the last exchange with the budget)."""
        seen = self.seen
        if self._shared and seen is not None:
            return max(0, seen.starts - seen.refused)
        since = before - WINDOW
        return max(0, count_between(self.starts, since, before) - count_between(self.refused, since, before))

    def lowered_pace(self, started_at: float, stretch: bool, pace: float) -> tuple[float, str] | None:
        """The pace a new 429 episode calls for, and why; None when it is no evidence of a limit."""
        if not stretch:
            # Refused right after a pause, before the pace could matter: the service is refusing
            # whatever we send (a storm). It lowers nothing, and what the service admitted before
            # says nothing about a limit.
            self.shown_limit = None
            return None
        admitted = self.admitted(started_at)
        if admitted >= FULL_MINUTE * pace / (1 + JITTER_MARGIN):
            return None  # it took a whole minute at the pace before refusing: the pace is not too high
        # Refused after a stretch of sending at the pace, having admitted less than a minute of it:
        # the limit is about what it admitted. Never more than halve the pace on one episode.
        self.shown_limit = max(MIN_RPM, float(admitted))
        lowered = max(MIN_RPM, math.floor(max(pace * MAX_DECREASE, min(pace, admitted) * UNDER_LIMIT)))
        return lowered, f"the service refused after admitting {admitted} requests in a minute at {pace:.0f}/min"

    def climbed_pace(self, now: float, paused_until: float, pace: float, rpm: float, ceiling: float) -> float | None:
        """The pace after the clean answer at ``now``: additively up toward ``ceiling`` (fast far from
        any limit the service showed, slowly near it, and probing above it); None for no change."""
        since = max(self.last_climb, paused_until)
        self.last_climb = now
        if not pace or pace >= ceiling or since == -math.inf or now <= since:
            return None
        shown = self.shown_limit
        if shown is not None and self.admitted(now) >= FORGET_SHARE * shown:
            self.shown_limit = shown = None  # the service admitted more in a minute: the limit is higher
        if shown is None or pace < 0.9 * shown:
            seconds = RECOVER_SECONDS
        else:
            seconds = APPROACH_SECONDS if pace < shown else PROBE_SECONDS
        return min(ceiling, pace + rpm * (now - since) / seconds)

    def another_lowered(self, pace: float, now: float) -> None:
        """Another process on the budget lowered the pace on its evidence of a limit about there."""
        self.shown_limit = pace / UNDER_LIMIT
        self.last_climb = now
