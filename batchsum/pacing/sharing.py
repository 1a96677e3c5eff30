"""What a pacer and the other users of its key's budget tell each other: each call to the budget
carries what the pacer owes it and brings back a pause or a pace someone else set, taken on here;
and a budget that came back empty (another epoch) is given again what this run holds of it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ..service.errors import BudgetError
from .auto.key_record import KeyRecord
from .budgets.exchange import AHEAD, COMMIT, LOOK, RESERVE, Budget, Report, Share, Slot
from .budgets.owed import Owed
from .budgets.presence import Presence
from .budgets.spacing import MIN_RPM
from .evidence import Evidence
from .paces import Paces
from .pause import Alarm, Pause
from .stated_room import Company

__all__ = ["Sharing"]

log = logging.getLogger("batchsum")
EMPTY = "the rate budget came back empty"


@dataclass(eq=False, slots=True)
class Sharing:
    """A pacer's side of its key's budget: every exchange tells it what is ``owed`` (its own pause,
    pace, starts and 429s) and takes on what others set; ``hold`` pauses every sender (shared through
    the budget unless the pause came from there). The key's record is written when it has news."""

    clock: Callable[[], float]
    budget: Budget
    share: Share | None
    paces: Paces
    pause: Pause
    evidence: Evidence
    company: Company
    alarm: Alarm
    record: KeyRecord | None
    owed: Owed
    presence: Presence | None = None  # the run on the key's budget: its entry published, its job's stop heard
    epoch: str | None = None  # the budget's epoch as this run first saw it (another: it came back empty)
    resets: int = 0  # times the budget came back empty during the run
    call: tuple[float, float] = (0.0, 0.0)  # the last call: when it was made and when it was answered
    asker: str = field(default_factory=lambda: os.urandom(6).hex())  # this pacer, to the budget (``Report.asker``)

    async def exchange(
        self,
        what: int,
        interval: float,
        last_start: float,
        *,
        commit: bool = True,
        ahead: int = 0,
        lead: float = 0.0,
        live: float = 0.0,
    ) -> Slot:
        """One call to the budget (``LOOK``, ``RESERVE``, ``COMMIT``, or ``AHEAD``: the next ``ahead``
        starts, the first at least ``lead`` from now; ``live``: a live request's, ``Budget.reserve``),
        telling it what it must share and adopting what others told it; the key's record written when
        it has news. ``last_start``: our last start (with the pause, the earliest our own state allows
        the next one). ``call``: when the budget was called and when it answered (our clock)."""
        before = self.clock()
        pace = self.paces.pace if self.paces.rpm else None
        report = self.owed.take(before, self.pause.left(before), self.pause.reason, pace)
        if self.presence is not None:
            report = self.presence.stamp(report)
        if what == AHEAD:
            report = dataclasses.replace(report, asker=self.asker)
        try:
            if what == RESERVE:
                slot = await self.budget.reserve(interval, report, share=self.share, commit=commit, live=live)
            elif what == AHEAD:
                slot = await self.budget.reserve(
                    interval, report, share=self.share, ahead=max(1, ahead), lead=lead, live=live
                )
            elif what == COMMIT:
                slot = await self.budget.commit(interval, report, live=live)
            else:
                slot = await self.budget.reserve(0.0, report, start=False)
        except BaseException:
            self.owed.untold(report, before)  # told with a later call
            raise
        self.call = (before, self.clock())
        if slot.epoch and slot.epoch != self.epoch:
            previous, self.epoch = self.epoch, slot.epoch
            if previous is not None:
                await self._came_back_empty(slot)
        floor = max(self.pause.until, last_start + interval)
        reserved = interval * (max(1, ahead) if what == AHEAD else 1) if what in (RESERVE, AHEAD) else None
        self.company.look(slot, before, self.evidence.starts, reserved, floor)
        self.evidence.seen = slot
        self.adopt(slot, report)
        if self.presence is not None:
            self.presence.heard(slot)
        if self.record is not None and self.record.pending:
            await self.record.flush()
        return slot

    async def flush(self, last_start: float) -> None:
        """Tell the budget what it has not heard yet (the last starts, a pause, a pace) and write the
        key's record: at the end of a batch, so that others' counts are whole. A budget out now is
        left untold (the outage was said already)."""
        if self.owed:
            try:
                await self.exchange(LOOK, 0.0, last_start)
            except BudgetError as exc:
                if self.budget.outage.since is None:
                    raise
                log.debug("the rate budget is out: the run's last counts are not told (%s)", exc)
        if self.record is not None:
            await self.record.flush()

    async def _came_back_empty(self, slot: Slot) -> None:
        """The budget answered with another epoch: it came back empty (a Redis restarted without its
        data). What lived there is given again from what this run holds: the pace starts again as
        after a pause (the gentle restart, no burst), a pause in force and a shared pace are told
        again, and the key's record is written again with its stamps. (The quota's counts this run
        saw are restored by ``quota.CountedQuota``, which hears the epoch through the run's presence
        and its own claims; the search's lead is asked again by ``search_lead.Lead`` and its state published.)"""
        now = self.clock()
        self.resets += 1
        log.warning("batchsum: %s at %s; what this run holds of it is written again", EMPTY, self.budget.where)
        shared_pace = self.owed.seen is not None and self.owed.seen.pace is not None
        self.pause.hold(now, EMPTY, ramp=bool(self.paces.pace))  # only the ramp: a pause must end later
        self.evidence.paused()
        owed = self.owed
        owed.pause_mark, owed.pace_version = None, slot.pace_version
        owed.pause = owed.pause or self.pause.paused(now)
        if shared_pace and self.paces.rpm:
            owed.pace = owed.pace or "climbed"  # written unless another run wrote one first
        if self.record is not None:
            await self.budget.rewrite(self.record.known())

    def adopt(self, slot: Slot, report: Report) -> None:
        """Take on a pause or a pace another user of the budget set."""
        now = self.clock()
        owed, paces = self.owed, self.paces
        owed.seen = slot
        if slot.paused_for > 0 and slot.pause_mark != owed.pause_mark:
            owed.pause_mark = slot.pause_mark
            if not report.pause_for:  # someone else's pause
                reason = slot.pause_reason or "another process sharing the budget got a 429"
                self.hold(now + slot.paused_for, reason, publish=False)
        if paces.rpm and slot.pace is not None and slot.pace_version != owed.pace_version:
            owed.pace_version = slot.pace_version
            pace = max(MIN_RPM, min(paces.ceiling, slot.pace))
            if slot.pace != report.pace and abs(pace - paces.pace) >= 0.5:  # someone else's pace
                if pace < paces.pace:  # lowered on their evidence of a limit about where it now is
                    self.evidence.another_lowered(pace, now)
                    paces.set(pace, "another process sharing the rate budget lowered it", now, publish=False)
                else:
                    paces.set(pace, None, now, publish=False)
                self.evidence.last_climb = now  # climb from here, not again over what they climbed

    def hold(self, until: float, reason: str, *, publish: bool = True) -> None:
        """Pause every sender until ``until`` (shared through the budget unless it came from there)."""
        now = self.clock()
        if self.pause.hold(until, reason, ramp=bool(self.paces.pace)):
            self.paces.log.paused(now, until, reason)
            self.owed.pause = self.owed.pause or publish
            if publish:
                self.alarm.ring()
        self.evidence.paused()
