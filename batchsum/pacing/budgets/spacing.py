"""The one spacing rule: consecutive starts on a budget are never closer than the interval of the
pace in force, counted from when each start really went out; the constants it is stated with.

Invariant: at a pace of at most ``rpm``, the interval is ``60 / rpm`` and a little more (the jitter
margin), so any half-open window of w > 0 seconds holds at most ``ceil(rpm * w / 60)`` starts: the
most a window of w holds at that spacing. The budget keeps the rule for every process sharing it
(``budget.Budget.commit``); nothing in the pacer may make a start's interval shorter, except the room a
service states (at most ``ROOM_SPEEDUP`` times the plan, see ``stated_room.py``).
"""

from __future__ import annotations

import math

__all__ = ["JITTER_MARGIN", "ROOM_SPEEDUP", "WINDOW", "MIN_RPM", "interval_of", "max_starts"]

JITTER_MARGIN = 0.01  # starts 1% further apart than the pace: arrival times wobble by milliseconds
ROOM_SPEEDUP = 10.0  # room a service states is spent at most this many times faster than the plan
WINDOW = 60.0  # the plan's limit is per minute
MIN_RPM = 1.0  # the pace is never lowered below one start a minute


def interval_of(pace: float) -> float:
    """Seconds between starts at ``pace`` requests a minute (0 without pacing), margin included."""
    return WINDOW / pace * (1 + JITTER_MARGIN) if pace else 0.0


def max_starts(rpm: float, window: float) -> int:
    """The most starts the pacer allows in any half-open window of ``window`` seconds at ``rpm``."""
    return math.ceil(rpm * window / WINDOW)
