"""A run second by second (``Timeline``): attempts started, 429s, rows done, the pace in force and
the pauses, as plain data that travels with a result and that the chart (``app/chart.py``) draws."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["Timeline"]


class Timeline:
    """What a run did, second by second: attempts started, 429s, rows done; the pace in force and
    the pauses, with why. One entry per second of the run (a day is 86,400), not per request, so
    it can travel with a result (``out.attrs["batchsum"]``) and be drawn (``batchsum.plot_run``)."""

    __slots__ = ("rpm", "_origin", "_wall", "_seconds", "_in_flight", "pace", "pauses")

    def __init__(self, rpm: float) -> None:
        self.rpm = rpm
        self._origin: float | None = None  # the clock at the first event
        self._wall = 0.0
        self._seconds: dict[int, list[int]] = {}  # second -> [started, refused, done]
        self._in_flight: dict[int, int] = {}  # second -> the most attempts on the wire in it
        self.pace: list[tuple[float, float]] = []  # (seconds since the start, pace from then on)
        self.pauses: list[tuple[float, float, str]] = []  # (from, until, why), seconds since the start

    def _since(self, now: float) -> float:
        if self._origin is None:
            self._origin, self._wall = now, time.time()
            self.pace.append((0.0, self.rpm))
        return max(0.0, now - self._origin)

    def _count(self, now: float, which: int) -> None:
        self._seconds.setdefault(int(self._since(now)), [0, 0, 0])[which] += 1

    def started(self, now: float) -> None:
        self._count(now, 0)

    def refused(self, now: float) -> None:
        self._count(now, 1)

    def done(self, now: float, count: int = 1) -> None:
        self._seconds.setdefault(int(self._since(now)), [0, 0, 0])[2] += count

    def in_flight(self, now: float, count: int) -> None:
        second = int(self._since(now))
        if count > self._in_flight.get(second, -1):
            self._in_flight[second] = count

    def pace_changed(self, now: float, pace: float) -> None:
        self.pace.append((self._since(now), pace))

    def paused(self, now: float, until: float, why: str) -> None:
        start, end = self._since(now), self._since(now) + (until - now)
        if self.pauses and self.pauses[-1][1] >= start:  # the same pause, made longer
            start, why = self.pauses[-1][0], self.pauses[-1][2]
            self.pauses.pop()
        self.pauses.append((start, end, why))

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and numbers (JSON-able): ``seconds`` rows are [second, started, refused, done];
        ``in_flight`` rows [second, the most attempts on the wire in it]."""
        return {
            "rpm": self.rpm,
            "started_at": self._wall or None,
            "seconds": [[second, *counts] for second, counts in sorted(self._seconds.items())],
            "in_flight": [[second, count] for second, count in sorted(self._in_flight.items())],
            "pace": [list(change) for change in self.pace],
            "pauses": [list(pause) for pause in self.pauses],
        }
