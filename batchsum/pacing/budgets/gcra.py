"""The state of a key's budget and its one atomic step (GCRA with commits), the same wherever the
budget lives (``budget.ProcessBudget``, ``sqlite_budget``; ``redis_budget`` runs it as Lua).

Invariant: a clock stepped back (an NTP correction, a suspended virtual machine's clock set right)
moves the whole schedule back with it, so nothing waits for the time lost; a clock stepped forward
leaves the last start where it was, so the next one is still an interval after it (no burst).

The live lane (``batchsum gateway``'s requests, ``live``: the part of the key they may take so): a
live reservation takes the key's next turn ahead of the batch runs' reserved starts while the lane's
own schedule (``live_next``, one start every ``interval / live``, two at once) has room. On a local
budget it is the first start the spacing allows after the key's last one (and after another live
start held), whatever the batch runs reserved: it is held for the live caller (``held``), so no other
start commits within an interval of it; the batch run whose reserved start it took finds its commit
refused and commits an interval later (its start handed back, in its place in its run, never lost);
the key's next free slot (``tat``) moves one interval for it. On a far budget a start reserved ahead
goes without asking again, so none is ever taken back: while a live lane is open with room, a batch
reservation whose first start would be more than its answer's way back (``lead``) and ``LIVE_SLACK``
away is deferred (nothing reserved: ask again then), so the batch runs hold the key's next start only
just before it goes and a live request finds it free. Every start is still an interval after the
key's last: the lane changes who takes a turn, never the spacing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from ...service.retry import MAX_RETRY_AFTER
from .exchange import AHEAD, COMMIT, LOOK, RESERVE, RESERVE_ONLY, SHARED_SECONDS, Report, Slot

__all__ = [
    "State",
    "Step",
    "share_wait",
    "deferred",
    "MAX_AHEAD",
    "ON_TIME",
    "MAX_PAUSE",
    "MINUTE",
    "KEEP_SECONDS",
    "REASON_CHARS",
    "LIVE_LEASE",
    "LIVE_SLACK",
    "QUEUE_MOST",
]

MAX_AHEAD = 3600.0  # a schedule further ahead than this (beyond its interval) is a clock that jumped back
ON_TIME = 1e-6  # within a microsecond is on time: a float sum can land an ulp short
MAX_PAUSE = 2 * MAX_RETRY_AFTER  # likewise for a pause
MINUTE = 60
KEEP_SECONDS = 180  # a share's schedule older than this is dropped
REASON_CHARS = 300
LIVE_LEASE = 60.0  # a live lane with no live call for this long is closed (far batch reservations go ahead again)
# A far batch reservation may hold the key's next start this much longer than its answer's way back
# while a live lane has room: a live request arriving within it waits one interval more (docs/pacing.md).
LIVE_SLACK = 0.005
# While the lane is open the far batch runs told to wait take the key's starts in the order they were
# told (the first one's start kept for it until it passes, then the next one's), not first come: else
# the run whose calls land soonest would take them all. At most this many wait so.
QUEUE_MOST = 16


class Step(NamedTuple):
    """What one step gives its caller: the start (``at``; None: a look, or nothing reserved),
    whether it is committed, whether it was reserved ahead of the batch runs (``live``: commit it as
    the live lane's), and, for a far reservation deferred for a live lane, the seconds to ask again in."""

    at: float | None
    committed: bool = False
    live: bool = False
    defer: float | None = None


@dataclass
class State:
    """A key's budget: the next free slot (``tat``), the shared pause and pace (written at
    ``pace_at``), the last committed start, when the state was last written (``updated``), and the
    live lane: the live start held and not yet committed (``held``: while it is after ``last``), the
    lane's own schedule (``live_next``: when its next start may go ahead of the batch runs) and until
    when it is open (``live_until``), and the start kept for a far batch run told to wait for it
    (``promised``, ``promisee``)."""

    tat: float = 0.0
    paused_until: float = 0.0
    reason: str | None = None
    pace: float | None = None
    pace_version: int = 0
    last: float = 0.0  # the key's last committed start
    pace_at: float = 0.0
    updated: float = 0.0
    held: float = 0.0
    live_next: float = 0.0
    live_until: float = 0.0
    promised: float = 0.0  # the start kept for the first far batch run told to wait while the lane had room ...
    promisee: str = ""  # ... the runs waiting (``Report.asker``, space-separated): each takes a start in turn

    def advance(
        self,
        now: float,
        interval: float,
        report: Report,
        what: int,
        count: int = 1,
        lead: float = 0.0,
        live: float = 0.0,
    ) -> Step:
        """Apply ``report``; then reserve the next start (``RESERVE``: its time, and whether it was
        committed at once), or commit a start now (``COMMIT``: now when the last committed start is
        an interval back and no pause holds, else the time it may be tried again), or reserve the
        next ``count`` starts ahead (``AHEAD``: the first's time, at least ``lead`` from now; each an
        interval after the one before, the last recorded as the key's last start at once). A ``LOOK``
        does neither. ``live``: a live caller's part of the key (``--interactive-share``; 0: a batch
        run's): its reservation goes ahead of the batch runs' while the lane has room, and its commit
        (of such a reservation) is not held back by the live start held."""
        interval = max(0.0, interval)
        self._set(now, interval, report)
        if live > 0:
            self.live_until = now + LIVE_LEASE
        if what == LOOK:
            return Step(None)
        ahead_of_batch = live > 0 and (what == COMMIT or self.live_next <= now + ON_TIME)
        due = max(self.last + interval, self.paused_until)
        if self.held > self.last and not (ahead_of_batch and what == COMMIT):
            due = max(due, self.held + interval)  # a live start held: nothing else within an interval of it
        if what == COMMIT:
            if due > now + ON_TIME:
                return Step(due)
            self.last = now
            return Step(now, True, ahead_of_batch)
        if ahead_of_batch:  # the lane's next start: two may go at once, then one every interval / live
            self.live_next = max(self.live_next + interval / live, now)
        way_back = max(0.0, min(lead, interval + 1.0)) if what == AHEAD else 0.0
        at = max(due, now + way_back) if ahead_of_batch else max(self.tat, due, now + way_back)
        if what == AHEAD:
            if not ahead_of_batch:
                me = report.asker if live <= 0 else ""  # a live caller beyond its lane's room keeps out of it
                queue: list[str] = []
                if me and self.live_until > now:
                    queue = self.promisee.split()
                    while queue and now > self.promised + LIVE_SLACK:  # the first did not come for its start
                        queue.pop(0)
                        self.promised += interval
                    self.promisee = " ".join(queue)
                if queue and queue[0] != me:  # the key's next start is kept for a run told to wait for it
                    if me not in queue and len(queue) < QUEUE_MOST:
                        queue.append(me)
                    self.promisee = " ".join(queue)
                    turns = queue.index(me) if me in queue else len(queue)
                    return Step(None, defer=max(ON_TIME, at + turns * interval - now - way_back - LIVE_SLACK / 2))
                if self.live_until > now and self.live_next <= at and at > now + way_back + LIVE_SLACK:
                    if me:  # a live request may take it; no batch run before the queue's first
                        self.promised, self.promisee = at, " ".join(queue or [me])
                    return Step(None, defer=at - now - way_back - LIVE_SLACK / 2)
                if queue:  # this run's turn: the next in the queue has the start after it
                    self.promised, self.promisee = at + interval, " ".join(queue[1:])
            count = max(1, count)
            self.tat = at + count * interval
            self.last = at + (count - 1) * interval
            return Step(at, False, ahead_of_batch)
        self.tat = max(self.tat, at) + interval
        if at <= now + ON_TIME and what == RESERVE:
            self.last = now
            return Step(now, True, ahead_of_batch)
        if ahead_of_batch and what in (RESERVE, RESERVE_ONLY):
            self.held = max(self.held, at)
        return Step(at, False, ahead_of_batch)

    def _set(self, now: float, interval: float, report: Report) -> None:
        """The clock's steps and the report applied: a pause someone began, a pace someone set."""
        if now < self.updated:  # the clock was stepped back: so is the schedule
            back = now - self.updated
            self.tat, self.last, self.paused_until = self.tat + back, self.last + back, self.paused_until + back
            self.pace_at, self.promised = self.pace_at + back, self.promised + back
            self.held, self.live_next, self.live_until = self.held + back, self.live_next + back, self.live_until + back
        self.updated = now
        if self.tat > now + interval + MAX_AHEAD:
            self.tat = now
        if self.last > now + MAX_AHEAD:
            self.last = now - interval
        if self.held > now + MAX_AHEAD:
            self.held = 0.0
        if self.paused_until > now + MAX_PAUSE:
            self.paused_until = now
        if report.pause_for > 0 and now + report.pause_for > self.paused_until:
            self.paused_until = now + min(report.pause_for, MAX_PAUSE)
            self.reason = (report.pause_reason or "")[:REASON_CHARS] or None
        if report.pace is not None and report.pace_base in (None, self.pace_version):
            self.pace = report.pace
            self.pace_version += 1
            self.pace_at = now

    def slot(self, now: float, step: Step, starts: int, refused: int, answered: int) -> Slot:
        """What the caller is told: its start (``step``), the pause and the pace (a pace not written
        for ``SHARED_SECONDS`` is nobody's any more), whether a live lane is open, and the key's
        counts of the last minute."""
        at = step.at
        return Slot(
            wait=step.defer if step.defer is not None else 0.0 if at is None or step.committed else max(0.0, at - now),
            at=at,
            paused_for=min(MAX_PAUSE, max(0.0, self.paused_until - now)),  # (now + x) - now may be x plus an ulp
            pause_mark=self.paused_until,
            pause_reason=self.reason,
            pace=self.pace if now - self.pace_at <= SHARED_SECONDS else None,
            pace_version=self.pace_version,
            starts=starts,
            refused=refused,
            answered=answered,
            committed=step.committed,
            deferred=step.defer is not None,
            live=step.live,
            live_open=self.live_until > now,
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
    return dataclasses.replace(slot, wait=turn, at=None, committed=False, live=False, deferred=True)
