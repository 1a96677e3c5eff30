"""What a pacer learns from each answer: a 429 pauses every sender and, on evidence, lowers the pace;
rate-limit headers state a limit and room; clean answers let it climb. Under ``--rpm auto`` the limit
moves on the key's ledger instead (``search_lead.py``): each answer goes there, told to the budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .auto.key_record import KeyRecord
from .auto.limit import distrusted, heard
from .auto.limit import stated as taken_as_stated
from .budgets.spacing import MIN_RPM
from .evidence import Evidence
from .in_flight import InFlight
from .paces import Paces
from .pause import Alarm, Pause
from .search_lead import Lead
from .sharing import Sharing
from .stated_room import StatedRoom, Statement

__all__ = ["Answers"]


@dataclass(eq=False, slots=True)
class Answers:
    """The pacer's conclusions from the attempts that ended (``ended``), and the 429s seen
    (``rate_limited``). Under ``auto`` (``lead``), a limit the service states is the lead's to take."""

    clock: Callable[[], float]
    paces: Paces
    pause: Pause
    evidence: Evidence
    room: StatedRoom
    sharing: Sharing
    alarm: Alarm
    in_flight: InFlight
    lead: Lead | None
    record: KeyRecord | None
    rate_limited: int = 0  # 429s seen

    def ended(
        self,
        started_at: float,
        now: float,
        rate_limited: bool,
        retry_after: float | None,
        answered: bool,
        headers: Statement | None,
    ) -> None:
        """The attempt that started at ``started_at`` ended at ``now`` (``Pacer.after_attempt``)."""
        if rate_limited:
            self._on_429(started_at, retry_after, now)
        if headers is not None:
            self._read(headers, started_at, now)
        if not rate_limited and answered:
            self.sharing.owed.answered.append(started_at)
            self.pause.clean_answer()
            self._climb(now)

    def _read(self, statement: Statement, started_at: float, now: float) -> None:
        """What the service's headers state: a limit below ours lowers the ceiling (said once); and,
        while its statements are trusted, the room left, or a pause when none is left."""
        stated, paces = statement.per_minute, self.paces
        if self.lead is not None:
            if stated is not None and self.room.trusted:
                heard(self.lead.auto, stated)
                if self.lead.leading and taken_as_stated(self.lead.auto, stated):
                    self.lead.moved(f"the service's rate-limit headers state {stated:g}/min")
        elif stated is not None and stated < paces.ceiling:
            paces.ceiling = max(MIN_RPM, stated)
            if paces.pace > paces.ceiling or not paces.pace:
                paces.set(paces.ceiling, f"the service's rate-limit headers state {stated:g}/min", now)
        if not self.room.trusted:
            return
        if statement.remaining == 0 and statement.reset is not None and statement.reset > 0:
            reset = statement.reset
            self.sharing.hold(
                now + reset, f"the service's rate-limit headers say none left until the reset in {reset:g} s"
            )
        if paces.pace and self.room.note(statement, started_at, now, self.evidence.starts, self.in_flight.wire()):
            self.alarm.ring()  # a turn waiting for the reset may go now

    def _on_429(self, started_at: float, retry_after: float | None, now: float) -> None:
        on_room = started_at in self.room.spent_at
        if self.room.refused(now):
            # The service refused while stating room: its statements are not believed again, in
            # this run and (the key's record) in the next.
            self.paces.note("the service refused while its headers stated room left; its room is not used again", now)
            if self.record is not None:
                self.record.room_contradicted()
            if self.lead is not None and self.lead.leading and distrusted(self.lead.auto):
                self.lead.moved("the limit its headers stated is searched for again")
        self.rate_limited += 1
        self.paces.log.refused(now)
        self.sharing.owed.refused.append(started_at)
        new_episode = started_at >= self.pause.until  # else it was sent before the pause in force
        stretch = self.evidence.refused_at(started_at, now, self.paces.pace)
        wait, why = self.pause.after_429(retry_after, new_episode)
        self.sharing.hold(now + wait, why)
        # A 429 for a start on stated room says the room was not there, not that the pace is too high;
        # under auto, what it says of the limit is read from the key's ledger by the search's lead.
        if on_room or not self.paces.pace or self.lead is not None:
            return
        if new_episode and stretch is not None:
            lowered = self.evidence.lowered_pace(started_at, stretch, self.paces.pace)
            if lowered is not None:
                self.paces.set(*lowered, now)

    def _climb(self, now: float) -> None:
        """Additive increase toward the ceiling while answers come back clean (under auto, the
        search's lead moves the level instead)."""
        if self.lead is not None:
            return
        paces = self.paces
        pace = self.evidence.climbed_pace(now, self.pause.until, paces.pace, paces.rpm, paces.ceiling)
        if pace is not None:
            paces.set(pace, "answers came back clean" if pace >= paces.ceiling else None, now)
