"""What a person or a scheduler sees of a run: its live counts (``BatchStats``), its one-line
account, and its timeline second by second (``Timeline``), as plain data that travels with a result
(``out.attrs["batchsum"]``) and that the chart (``chart.py``) draws."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .results import OK, SKIPPED, RowResult

if TYPE_CHECKING:
    from .pacing import Pacer, PacerState

__all__ = ["BatchStats", "Timeline"]


class Timeline:
    """What a run did, second by second: attempts started, 429s, rows done; the pace in force and
    the pauses, with why. One entry per second of the run (a day is 86,400), not per request, so
    it can travel with a result (``out.attrs["batchsum"]``) and be drawn (``batchsum.plot_run``)."""

    __slots__ = ("rpm", "_origin", "_wall", "_seconds", "pace", "pauses")

    def __init__(self, rpm: float) -> None:
        self.rpm = rpm
        self._origin: float | None = None  # the clock at the first event
        self._wall = 0.0
        self._seconds: dict[int, list[int]] = {}  # second -> [started, refused, done]
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

    def done(self, now: float) -> None:
        self._count(now, 2)

    def pace_changed(self, now: float, pace: float) -> None:
        self.pace.append((self._since(now), pace))

    def paused(self, now: float, until: float, why: str) -> None:
        start, end = self._since(now), self._since(now) + (until - now)
        if self.pauses and self.pauses[-1][1] >= start:  # the same pause, made longer
            start, why = self.pauses[-1][0], self.pauses[-1][2]
            self.pauses.pop()
        self.pauses.append((start, end, why))

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and numbers (JSON-able): ``seconds`` rows are [second, started, refused, done]."""
        return {
            "rpm": self.rpm,
            "started_at": self._wall or None,
            "seconds": [[second, *counts] for second, counts in sorted(self._seconds.items())],
            "pace": [list(change) for change in self.pace],
            "pauses": [list(pause) for pause in self.pauses],
        }


@dataclass
class BatchStats:
    """Live counts of a batch, read by progress bars and the final account."""

    total: int | None = None
    done: int = 0  # rows whose result is known (counted as they arrive, in any order)
    yielded: int = 0  # rows handed out, in input order (what an output holds so far)
    ok: int = 0
    skipped: int = 0
    failed: int = 0
    sent: int = 0  # requests that went to the service (each may take several attempts)
    attempts: int = 0
    reused: int = 0  # rows answered from the store or by an identical request of this run
    skipped_by_reason: Counter[str] = field(default_factory=Counter)
    failed_by_code: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    pacer: Pacer | None = None

    @property
    def rate_limited(self) -> int:
        return self.pacer.rate_limited if self.pacer else 0

    @property
    def pace(self) -> float:
        return self.pacer.pace if self.pacer else 0.0

    def pacer_state(self) -> PacerState | None:
        """The pacer's state now (pace, pause and why, in flight), for progress lines."""
        try:
            return self.pacer.state() if self.pacer else None
        except RuntimeError:  # no running loop (read from another thread after the run)
            return None

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def record(self) -> dict[str, Any]:
        """The run's account and timeline as plain data (``out.attrs["batchsum"]``, ``plot_run``)."""
        timeline = self.pacer.timeline.to_dict() if self.pacer is not None else None
        if timeline is not None:
            timeline["total"] = self.total
        return {
            "account": self.account(),
            "rows": self.done,
            "ok": self.ok,
            "skipped": self.skipped,
            "failed": self.failed,
            "sent": self.sent,
            "reused": self.reused,
            "rate_limited": self.rate_limited,
            "skipped_by_reason": dict(self.skipped_by_reason),
            "failed_by_code": dict(self.failed_by_code),
            "seconds": round(self.elapsed, 3),
            "pace_changes": [str(change) for change in self.pacer.changes] if self.pacer is not None else [],
            "timeline": timeline,
        }

    def count(self, result: RowResult) -> None:
        if self.pacer is not None:
            self.pacer.timeline.done(self.pacer.now())
        self.done += 1
        if result.status == OK:
            self.ok += 1
        elif result.status == SKIPPED:
            self.skipped += 1
            self.skipped_by_reason[result.error or "?"] += 1
        else:
            self.failed += 1
            self.failed_by_code[result.error or "?"] += 1

    def account(self) -> str:
        """One line: rows, sent, reused, skipped by reason, failed by code, 429s, wall time."""

        def by(counter: Counter[str]) -> str:
            return " (" + ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) + ")" if counter else ""

        return (
            f"{self.done} rows: {self.ok} ok, {self.skipped} skipped{by(self.skipped_by_reason)}, "
            f"{self.failed} failed{by(self.failed_by_code)}; {self.sent} sent, {self.reused} reused, "
            f"{self.rate_limited} 429s, {self.elapsed:.1f}s"
        )
