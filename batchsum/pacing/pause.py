"""The shared 429 pause and the gentle restart after it (the ramp), and the alarm that wakes a turn
waiting through a pause this process set (``Alarm``).

Invariant: a pause only ever ends later (``hold`` never shortens one), and the ramp only widens the
spacing (its factor is at least 1 and shrinks back to 1 start by start), so neither can let two starts
closer than the pace's interval.
"""

from __future__ import annotations

import asyncio
import math

from ..service.retry import MAX_RETRY_AFTER, backoff

__all__ = ["Pause", "Alarm", "RAMP_START", "RAMP_DECAY"]

RAMP_START = 2.0  # after a pause, the first starts are this many intervals apart ...
RAMP_DECAY = 0.85  # ... and each start brings the spacing this much closer to normal
ON_TIME = 1e-6  # a pause that ends within a microsecond has ended (a float sum can land an ulp short)


class Pause:
    """Until when nothing starts and why; the ramp; 429 episodes since the last clean answer (the
    backoff's exponent when the service names no wait)."""

    __slots__ = ("until", "reason", "ramp", "episodes", "steady_since")

    def __init__(self) -> None:
        self.until = -math.inf
        self.reason: str | None = None
        self.ramp = 1.0
        self.episodes = 0
        self.steady_since = -math.inf  # when the last ramp ended (the pace in force since)

    def hold(self, until: float, reason: str, *, ramp: bool = True) -> bool:
        """Pause until ``until`` (if that is later than the pause in force); whether it is longer now.
        ``ramp``: the restart is gentle (the pace's first starts doubled apart)."""
        if ramp:
            self.ramp, self.steady_since = RAMP_START, math.inf
        if until <= self.until:
            return False
        self.until, self.reason = until, reason
        return True

    def paused(self, now: float) -> bool:
        return now < self.until - ON_TIME

    def left(self, now: float) -> float:
        return max(0.0, self.until - now)

    def started(self, now: float) -> None:
        """A start went out at ``now``: the ramp comes a step closer to the pace."""
        self.ramp = max(1.0, self.ramp * RAMP_DECAY)
        if self.ramp == 1.0 and self.steady_since == math.inf:
            self.steady_since = now

    def after_429(self, retry_after: float | None, new_episode: bool) -> tuple[float, str]:
        """How long a 429 pauses everyone, and why: the service's Retry-After, or a jittered backoff
        that grows with the episodes (never 0: that would be a retry storm); at most
        ``MAX_RETRY_AFTER``."""
        if new_episode:
            self.episodes += 1
        if retry_after is not None:
            wait, why = retry_after, f"the service answered 429 (Retry-After {retry_after:g})"
        else:
            wait = backoff(min(max(1, self.episodes), 8))
            why = "the service answered 429 without a usable Retry-After; backing off"
        return min(wait, MAX_RETRY_AFTER), why

    def clean_answer(self) -> None:
        self.episodes = 0


class Alarm:
    """Wakes the turn asleep on its wait when what it waits for may have changed: our own 429
    paused us (to share the pause at once), or the service stated room (a wait for its reset ends)."""

    __slots__ = ("_wake",)

    def __init__(self) -> None:
        self._wake: asyncio.Event | None = None

    async def nap(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when the alarm rings meanwhile."""
        self._wake = wake = asyncio.Event()
        try:
            await asyncio.wait_for(wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        finally:
            self._wake = None

    def ring(self) -> None:
        if self._wake is not None:
            self._wake.set()
