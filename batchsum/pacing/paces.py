"""The pace in force, the ceiling it may climb to, the paces of the last two minutes, and the log of
its changes (each ``PaceChange`` reported once with its reason; every change told to the ``PaceLog``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .budgets.owed import Owed
from .budgets.spacing import WINDOW, interval_of

__all__ = ["Paces", "PaceChange", "PaceLog"]


class PaceLog(Protocol):
    """What the pacer tells of what it does (``engine.timeline.Timeline`` keeps it second by second)."""

    def started(self, now: float) -> None: ...

    def refused(self, now: float) -> None: ...

    def paused(self, now: float, until: float, why: str) -> None: ...

    def pace_changed(self, now: float, pace: float) -> None: ...


class _Unlogged:
    def started(self, now: float) -> None:
        pass

    def refused(self, now: float) -> None:
        pass

    def paused(self, now: float, until: float, why: str) -> None:
        pass

    def pace_changed(self, now: float, pace: float) -> None:
        pass


@dataclass(frozen=True)
class PaceChange:
    """A change of the pace in force, reported once with its reason."""

    at: float
    pace: float
    previous: float
    reason: str

    def __str__(self) -> str:
        if self.pace == self.previous:
            return f"pace kept at {self.pace:g}/min: {self.reason}"
        verb = "lowered" if self.pace < self.previous else "raised"
        return f"pace {verb} to {self.pace:g}/min: {self.reason}"


class Paces:
    """The pace in force (``pace``); the ``ceiling``: ``rpm``, or lower when the service's headers
    state a lower limit (under auto, the limit in force); the changes reported (``changes``, each
    also told to ``on_change``); what the pace was over the last two minutes (``at``). A change this
    pacer made is owed to the budget (``owed``), so that the other users of the key take it on."""

    __slots__ = ("rpm", "pace", "ceiling", "changes", "log", "_history", "_owed", "_on_change")

    def __init__(
        self,
        rpm: float,
        pace: float,
        ceiling: float,
        owed: Owed,
        log: PaceLog | None = None,
        on_change: Callable[[PaceChange], None] | None = None,
    ) -> None:
        self.rpm = rpm
        self.pace = pace
        self.ceiling = ceiling
        self.changes: list[PaceChange] = []
        self.log: PaceLog = log if log is not None else _Unlogged()
        self._history: deque[tuple[float, float]] = deque([(-math.inf, pace)])  # (since, pace), two minutes
        self._owed = owed
        self._on_change = on_change

    @property
    def interval(self) -> float:
        """Seconds between starts at the pace in force (0 without pacing)."""
        return interval_of(self.pace)

    @property
    def rate(self) -> float:
        """Starts per second at the pace in force."""
        return self.pace / WINDOW

    def at(self, when: float) -> float:
        """The pace that was in force at ``when`` (of the last two minutes)."""
        for since, pace in reversed(self._history):
            if since <= when:
                return pace
        return self._history[0][1]

    def set(self, pace: float, reason: str | None, now: float, *, publish: bool = True) -> None:
        """Change the pace; a ``reason`` makes it a reported change (climbing steps are not)."""
        if pace == self.pace:
            return
        previous, self.pace = self.pace, pace
        self._history.append((now, pace))
        while len(self._history) > 1 and self._history[1][0] < now - 2 * WINDOW:
            self._history.popleft()
        self.log.pace_changed(now, pace)
        if publish:  # a lowering is told as such even when a climb follows before the next report
            self._owed.pace = "lowered" if pace < previous or self._owed.pace == "lowered" else "climbed"
        if reason is not None:
            self._changed(PaceChange(now, pace, previous, reason))

    def note(self, reason: str, now: float) -> None:
        """A decision said once, with the pace as it is (the room's distrust)."""
        self._changed(PaceChange(now, self.pace, self.pace, reason))

    def _changed(self, change: PaceChange) -> None:
        self.changes.append(change)
        if self._on_change is not None:
            self._on_change(change)
