"""The state of a key's budget and its one atomic step (GCRA with commits), the same wherever the
budget lives (``budget.ProcessBudget``, ``sqlite_budget``; ``redis_budget`` runs it as Lua).

Invariant: a clock stepped back (an NTP correction, a suspended virtual machine's clock set right)
moves the whole schedule back with it, so nothing waits for the time lost; a clock stepped forward
leaves the last start where it was, so the next one is still an interval after it (no burst).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...service.retry import MAX_RETRY_AFTER
from .exchange import AHEAD, COMMIT, LOOK, RESERVE, SHARED_SECONDS, Report, Slot

__all__ = [
    "State",
    "share_wait",
    "deferred",
    "MAX_AHEAD",
    "ON_TIME",
    "MAX_PAUSE",
    "MINUTE",
    "KEEP_SECONDS",
    "REASON_CHARS",
]

MAX_AHEAD = 3600.0  # a schedule further ahead than this (beyond its interval) is a clock that jumped back
ON_TIME = 1e-6  # within a microsecond is on time: a float sum can land an ulp short
MAX_PAUSE = 2 * MAX_RETRY_AFTER  # likewise for a pause
MINUTE = 60
KEEP_SECONDS = 180  # a share's schedule older than this is dropped
REASON_CHARS = 300


@dataclass
class State:
    """A key's budget: the next free slot (``tat``), the shared pause and pace (written at
    ``pace_at``), the last committed start, and when the state was last written (``updated``)."""

    tat: float = 0.0
    paused_until: float = 0.0
    reason: str | None = None
    pace: float | None = None
    pace_version: int = 0
    last: float = 0.0  # the key's last committed start
    pace_at: float = 0.0
    updated: float = 0.0

    def advance(
        self, now: float, interval: float, report: Report, what: int, count: int = 1, lead: float = 0.0
    ) -> tuple[float | None, bool]:
        """Apply ``report``; then reserve the next start (``RESERVE``: its time, and whether it was
        committed at once), or commit a start now (``COMMIT``: now when the last committed start is
        an interval back and no pause holds, else the time it may be tried again), or reserve the
        next ``count`` starts ahead (``AHEAD``: the first's time, at least ``lead`` from now; each an
        interval after the one before, the last recorded as the key's last start at once). A ``LOOK``
        does neither: (None, False)."""
        interval = max(0.0, interval)
        if now < self.updated:  # the clock was stepped back: so is the schedule
            back = now - self.updated
            self.tat, self.last, self.paused_until = self.tat + back, self.last + back, self.paused_until + back
            self.pace_at += back
        self.updated = now
        if self.tat > now + interval + MAX_AHEAD:
            self.tat = now
        if self.last > now + MAX_AHEAD:
            self.last = now - interval
        if self.paused_until > now + MAX_PAUSE:
            self.paused_until = now
        if report.pause_for > 0 and now + report.pause_for > self.paused_until:
            self.paused_until = now + min(report.pause_for, MAX_PAUSE)
            self.reason = (report.pause_reason or "")[:REASON_CHARS] or None
        if report.pace is not None and report.pace_base in (None, self.pace_version):
            self.pace = report.pace
            self.pace_version += 1
            self.pace_at = now
        if what == LOOK:
            return None, False
        due = max(self.last + interval, self.paused_until)
        if what == COMMIT:
            if due > now + ON_TIME:
                return due, False
            self.last = now
            return now, True
        at = max(self.tat, due, now + (max(0.0, min(lead, interval + 1.0)) if what == AHEAD else 0.0))
        if what == AHEAD:
            count = max(1, count)
            self.tat = at + count * interval
            self.last = at + (count - 1) * interval
            return at, False
        self.tat = at + interval
        if at <= now + ON_TIME and what == RESERVE:
            self.last = now
            return now, True
        return at, False

    def slot(
        self, now: float, at: float | None, starts: int, refused: int, answered: int, committed: bool = False
    ) -> Slot:
        """What the caller is told: its start (``at``), the pause and the pace (a pace not written for
        ``SHARED_SECONDS`` is nobody's any more), and the key's counts of the last minute."""
        return Slot(
            wait=0.0 if at is None or committed else max(0.0, at - now),
            at=at,
            paused_for=min(MAX_PAUSE, max(0.0, self.paused_until - now)),  # (now + x) - now may be x plus an ulp
            pause_mark=self.paused_until,
            pause_reason=self.reason,
            pace=self.pace if now - self.pace_at <= SHARED_SECONDS else None,
            pace_version=self.pace_version,
            starts=starts,
            refused=refused,
            answered=answered,
            committed=committed,
        )


def share_wait(own_tat: float, now: float, own_interval: float) -> float | None:
    """How long a shared run must still wait for its own turn (None: it has come)."""
    if own_tat > now + own_interval + MAX_AHEAD:  # a clock that jumped back: start afresh
        return None
    return own_tat - now if own_tat > now + ON_TIME else None


def deferred(slot: Slot, turn: float | None) -> Slot:
    """``slot``, or when the shared run's turn has not come, the wait for it with nothing reserved."""
    if turn is None:
        return slot
    return Slot(
        wait=turn,
        at=None,
        paused_for=slot.paused_for,
        pause_mark=slot.pause_mark,
        pause_reason=slot.pause_reason,
        pace=slot.pace,
        pace_version=slot.pace_version,
        starts=slot.starts,
        refused=slot.refused,
        answered=slot.answered,
        deferred=True,
    )
