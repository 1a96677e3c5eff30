"""The pacer: request starts evenly spaced under the plan's per-minute limit, one shared pause on 429.

Starts are spaced at least ``60 / rpm`` seconds apart (plus a 1% margin for network jitter), so in
any window of w seconds there are at most ceil(rpm*w/60)+1 starts, with no burst at the beginning:
a service counting per fixed or per sliding minute never sees more than it allows. A token bucket
that starts full (``AsyncLimiter(rpm, 60)``) instead sends up to 2*rpm in the first minute.

A 429 pauses every sender until its Retry-After (or a backoff when it gives none); afterwards the
spacing starts doubled and shrinks back to normal, so the restart is gentle. A 429 from a request
started after the previous pause ended means the real limit is lower than configured: from the
second such episode on, the pace drops by a fifth each time, and ``on_pace_change`` is told.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

from ._retry import backoff

__all__ = ["Pacer", "JITTER_MARGIN", "max_starts"]

JITTER_MARGIN = 0.01  # pace 1% under the limit: arrival times wobble by milliseconds
RAMP_START = 2.0  # after a pause, the first starts are this many intervals apart ...
RAMP_DECAY = 0.85  # ... and each start brings the spacing this much closer to normal
LOWER_BY = 0.8  # a repeated 429 episode sets the pace to this share of what it was
MIN_RPM = 1.0


def max_starts(rpm: float, window: float) -> int:
    """The most starts the pacer allows in any ``window`` seconds at ``rpm``: ceil(rpm*w/60)+1."""
    return math.ceil(rpm * window / 60) + 1


class Pacer:
    """Shared by every sender of a batch. ``await before_attempt()`` before each attempt (retries
    included); ``after_rate_limit(started_at, retry_after)`` after each 429. ``rpm=0``: no pacing,
    but 429 pauses are still shared."""

    __slots__ = (
        "rpm",
        "pace",
        "rate_limited",
        "_clock",
        "_sleep",
        "_next",
        "_paused_until",
        "_episodes",
        "_ramp",
        "_on_pace_change",
    )

    def __init__(
        self,
        rpm: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_pace_change: Callable[[float], None] | None = None,
    ) -> None:
        if rpm < 0 or rpm != rpm:
            raise ValueError(f"invalid rpm {rpm!r}: use a number of requests per minute >= 0 (0 = no pacing)")
        self.rpm = float(rpm)
        self.pace = float(rpm)  # the pace in force: rpm, or lower after repeated 429s
        self.rate_limited = 0  # 429s seen
        self._clock = clock
        self._sleep = sleep
        self._next = -math.inf  # earliest time of the next start
        self._paused_until = -math.inf
        self._episodes = 0
        self._ramp = 1.0
        self._on_pace_change = on_pace_change

    @property
    def interval(self) -> float:
        """Seconds between starts now (0 without pacing)."""
        if not self.pace:
            return 0.0
        return 60.0 / self.pace * (1 + JITTER_MARGIN) * self._ramp

    async def before_attempt(self) -> float:
        """Wait for this attempt's turn; returns the time it starts (for ``after_rate_limit``)."""
        while True:
            now = self._clock()
            start = max(now, self._next, self._paused_until)
            if self.pace:
                self._next = start + self.interval
                self._ramp = max(1.0, self._ramp * RAMP_DECAY)
            paused_until = self._paused_until
            if start > now:
                await self._sleep(start - now)
            if self._paused_until == paused_until or self._paused_until <= start:
                return start
            # A 429 arrived while we waited and its pause covers our turn: queue again behind it.

    def after_rate_limit(self, started_at: float, retry_after: float | None) -> None:
        """A 429 answered the attempt that started at ``started_at``: pause everyone."""
        self.rate_limited += 1
        now = self._clock()
        new_episode = started_at >= self._paused_until
        if new_episode:
            self._episodes += 1
        wait = retry_after if retry_after is not None else backoff(min(self._episodes, 6))
        self._paused_until = max(self._paused_until, now + wait)
        self._next = max(self._next, self._paused_until)
        if self.pace:
            self._ramp = RAMP_START
            if new_episode and self._episodes > 1:
                self.pace = max(MIN_RPM, self.pace * LOWER_BY)
                if self._on_pace_change is not None:
                    self._on_pace_change(self.pace)
