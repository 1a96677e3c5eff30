"""The search for a key's limit under ``--rpm auto``: a cautious start that climbs while the key's
answers come back clean, and settles under what the service shows when it refuses. It reads the
key's ledger (``ledger.Ledger``: every process on the key together) on the budget's clock, and is
plain data, so whoever leads the search (``search_lead.py``) can hand it on.

- climb: from ``START_RPM`` (or the cap, if lower), the level climbs by half again (``CLIMB``) each
  ``STEP_SECONDS`` of clean sending at it (the key really sent at the level); a level held that long
  is proven (``lo``), as far as windows of 10 s or less can tell.
- The first refusal above ``lo`` bounds the limit (``hi``). If the key's trailing minute admitted
  about ``lo`` or more, a minute's window refused, full: the limit is what it admitted. Else a shorter
  window (1 s, 10 s) or a bucket refused, or a minute's window that the climb outran: the level drops
  back to ``lo`` (verify) until the trailing minute admits more than it did at the refusal (refused
  again first: a minute's window after all, full, at what it admitted), then bisects between ``lo``
  and ``hi`` (refine), each level held long enough for a bucket that holds 2.5 s of the limit to
  refuse it, until the two are within ``FINE``.

Invariants: every level is an even pace (the spacing rule holds whatever it is); a level is proven
only by clean answers to starts the key really sent at it; a refusal counts for the level in force
when its start went out (after a lowering, starts within ``adopt_seconds`` of it count for neither).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from ..budgets.ledger import TICK, Ledger
from ..budgets.spacing import JITTER_MARGIN, MIN_RPM, WINDOW
from .minute_window import minute_reset, window_count

__all__ = [
    "Search",
    "Settle",
    "START_RPM",
    "CLIMB",
    "STEP_SECONDS",
    "FINE",
    "BUCKET_SECONDS",
    "adopt_seconds",
    "proof_seconds",
    "sent_evenly",
    "probed",
    "search_data",
    "search_from",
]

START_RPM = 60.0  # with nothing known, the search starts here (or at the cap, if lower) ...
CLIMB = 1.5
STEP_SECONDS = 10.0  # ... after each stretch this long of clean sending at a level
REFINE_SECONDS = 30.0  # a bisection step's level is held at least this long (three 10 s windows) ...
BUCKET_SECONDS = 2.5  # ... and long enough for a bucket holding this much of the limit to run dry at it
MAX_PROOF = 90.0  # ... but no longer than this
FINE = 1.03  # a bracket this narrow ends the search at its lower end, once confirmed ...
LANDS = 1.02  # ... so that a limit found is at most this much over the service's
CONFIRM_SECONDS = 2.5 / (LANDS - 1)  # (the time a bucket of 2.5 s of a limit 2% under it takes to run dry)
MINUTE_BINDS = 0.97  # a trailing minute that admitted this share of the proven level was a full minute
SENT = 0.8  # a level is tested when the key sent at least this share of it
SUSPECT_SECONDS = STEP_SECONDS  # a refusal this soon after a climb may be the level before's (a window holds both)
RESET_SLACK = (
    1.0  # the resume comes up to a second or so after the reset (the 429's answer, a Retry-After in whole seconds)
)
VERIFY_SPARE = 5  # (a start counts from when it goes: those on the wire are among these)
VERIFY_MARGIN = 1  # ... and admitted this many more than it held: no minute's window refused then
PENDING_SECONDS = 10.0  # starts this recent and not yet answered are on the wire
VERIFY_MAX = 90.0  # verifying this long, held at what the minute held and never refused: that is the limit  # verifying, the key's trailing minute may hold this many more than when it refused


def adopt_seconds(level: float) -> float:
    """How long after a level is set every process on the key sends at it: each takes it on at its
    next tick (a second) or start, and a start reserved before goes at the old interval."""
    return min(3.0, 1.0 + WINDOW / max(level, MIN_RPM))


def proof_seconds(level: float, below: float) -> float:
    """How long ``level`` must hold clean to prove it, when ``below`` is proven: three 10 s windows,
    and the time a bucket holding ``BUCKET_SECONDS`` of a limit just above ``below`` takes to run dry
    at ``level``."""
    if below <= 0 or level <= below:
        return REFINE_SECONDS
    return min(MAX_PROOF, max(REFINE_SECONDS, BUCKET_SECONDS * below / (level - below)))


def probed(ledger: Ledger, since: float, value: float, level: float, pace: float) -> bool | None:
    """A probe at ``level`` above a limit ``value``, its starts at ``pace`` from ``since``: refused
    (False), or clean for long enough that every window kind would have refused it (True): through a
    whole minute of the clock after it began, and a bucket's drain time at its excess; else None."""
    if ledger.first_refused(since) is not None:
        return False
    minute_after = (math.floor(since / WINDOW) + 2) * WINDOW
    drained = since + BUCKET_SECONDS * value / max(level - value, 1e-9)
    last = ledger.answered_until(since)
    if last is not None and last >= max(minute_after, drained) and sent_evenly(ledger, since, last, pace):
        return True
    return None


def sent_evenly(ledger: Ledger, since: float, before: float, level: float) -> bool:
    """Whether the key sent at about ``level`` from ``since`` to ``before`` with no refusal."""
    seconds = before - since
    if seconds <= 0 or ledger.refusals(since, before):
        return False
    return ledger.started(since, before) >= SENT * level * seconds / WINDOW


class Settle(NamedTuple):
    """A step that ends the search: the limit is ``value``, known ``how``."""

    value: float
    how: str


@dataclass
class Search:
    """The search's state (the budget's clock): the ``phase`` (climb, verify, refine), the ``level``
    tried ``since`` when, the level before it (``before``), the bracket (``lo``:
    the highest level proven clean, from ``lo_since``; ``hi``: the lowest refused), and what the
    trailing minute must exceed for verifying to end. ``step`` reads the ledger and answers whether
    the level moved, or the limit the search ends on."""

    cap: float
    phase: str = "climb"
    level: float = START_RPM
    since: float = -math.inf
    before: float = 0.0
    lo: float = 0.0
    lo_since: float = -math.inf
    below: float = 0.0  # the level proven before ``lo`` (``lo`` refused while confirming: it is again)
    hi: float = math.inf
    verify_above: int = 0
    refused_first: float | None = None  # the first refusal's start (verifying after it)
    cap_count: int | None = None  # verifying: the most the key's trailing minute may hold

    def step(self, ledger: Ledger) -> bool | Settle:
        """One look at the key's ledger: whether the level moved, or the limit the search ends on."""
        now = ledger.now
        refused = self._refused_at(ledger)
        if refused is not None:
            return self._refused(ledger, *refused)
        held = self._held(ledger)
        if self.phase == "climb" and held >= STEP_SECONDS:
            self.cap_count = None
            self._proven()
            if self.level >= self.cap:
                return Settle(self.cap, "capped")
            return self.tried(min(self.cap, self.level * CLIMB), now)
        if self.phase == "verify" and (self.lo > 0 or held >= STEP_SECONDS):  # the level itself proven
            if ledger.admitted(now - WINDOW, now) > self.verify_above + VERIFY_MARGIN:
                # The trailing minute admitted more than when it refused: no minute's window refused
                # then; a shorter one (or a bucket) did. Bisect up from here.
                self.phase = "refine"
                self._proven()
                return self._narrowed(now)
            reset = minute_reset(ledger, self.refused_first, self.verify_above, self.cap_count is not None)
            if reset is not None:
                return Settle(max(MIN_RPM, min(float(reset), self.hi)), "found")
            if now - self.since >= VERIFY_MAX:  # held at what the minute held, and never refused: its limit
                return Settle(max(MIN_RPM, min(float(self.verify_above), self.hi)), "found")
        if self.phase == "refine" and held >= proof_seconds(self.level, self.lo):
            self._proven()
            return self._narrowed(now)
        if self.phase == "confirm" and held >= CONFIRM_SECONDS:
            # What the service admitted: the level's starts, which go the spacing's margin under it.
            return Settle(self.lo / (1 + JITTER_MARGIN), "found")
        return False

    def _proven(self) -> None:
        """The level in force held clean: it is the highest proven."""
        if self.level != self.lo:
            self.below, self.lo = self.lo, self.level
        self.lo_since = self.since

    def _refused_at(self, ledger: Ledger) -> tuple[float, float] | None:
        """The first refusal that bounds the limit, and the level its start went out at: of the
        proven level's own span while climbing (its answers came back slowly: it is refused after
        all), else of the level in force (after a lowering, of its starts once every process took
        it on)."""
        since = self.since + (adopt_seconds(self.before) if self.level < self.before else 0.0)
        if self.phase == "climb" and self.lo > 0:
            first = ledger.first_refused(self.lo_since)
            if first is not None and first < self.since:
                return first, self.lo
        first = ledger.first_refused(since)
        return None if first is None else (first, self.level)

    def _held(self, ledger: Ledger) -> float:
        """How long the level has held clean, by the starts the key really sent at it and every one
        of them answered."""
        since = self.since + adopt_seconds(self.before)
        last = ledger.answered_until(since)
        if last is None or not sent_evenly(ledger, since, last, self.level):
            return 0.0
        return last - self.since

    def _refused(self, ledger: Ledger, at: float, level: float) -> bool | Settle:
        now = ledger.now
        if ledger.pending(at - PENDING_SECONDS, at) and now - at < PENDING_SECONDS:
            if self.phase == "verify":
                self.cap_count = 0  # refused again: nothing more goes until it is judged
            return False  # the starts before it are not all answered yet: what the minute held is not known
        # What the minute before it admitted: its tick (``at`` is the tick's beginning) ends it, as the
        # starts admitted in that tick went before the refused one (the window was full after it).
        admitted = ledger.admitted(at + TICK - WINDOW, at + TICK)
        if self.phase == "climb":
            full = ledger.started(at - WINDOW, at - WINDOW + STEP_SECONDS / 2) > 0  # sent the whole minute
            if full and self.lo > 0 and level > self.lo and admitted >= MINUTE_BINDS * self.lo:
                # A minute's window refused, full, at what it admitted (the key sent through the
                # minute at least the proven level's count).
                return Settle(min(float(admitted), level), "found")
            if level <= self.lo or at < self.since + SUSPECT_SECONDS:
                # The proven level is refused after all (its answers came back slowly), or the window
                # that refused so soon after the climb may have held mostly its starts: the one before
                # is the proven one.
                self.lo = self.lo / CLIMB if self.lo > min(self.cap, START_RPM) * 1.001 else 0.0
            self.hi = min(self.hi, level)
            # Refused before a minute was full (or before any level was proven): check the proven level
            # (or two thirds of the refused one) on its own, until the minute holds more than now.
            self.phase, self.verify_above, self.refused_first = "verify", admitted, at
            # When the key sent through the whole minute before it, a minute's window may be what
            # refused, full: the minute may hold only a few more until that is known.
            self.cap_count = admitted + VERIFY_SPARE if full else None
            return self.tried(self.lo if self.lo > 0 else level / CLIMB, now)
        if self.phase == "verify":
            self.hi = min(self.hi, level)
            if self.lo > 0 or admitted >= MINUTE_BINDS * level:
                # Refused again at a level the climb held (or with its minute full): a minute's
                # window, full; it admitted its limit.
                count = window_count(ledger, self.refused_first, at, admitted)
                return Settle(max(MIN_RPM, min(float(count), level)), "found")
            # Nothing proven yet (the cautious start was above the limit) and refused before the
            # minute was full: a shorter window (or a bucket) under this level too. A step lower.
            self.verify_above = max(self.verify_above, admitted)
            return self.tried(level / CLIMB, now)
        if self.phase == "confirm":  # the proven level is refused after all: the one before it is
            self.lo, self.phase = self.below, "refine"
        self.hi = min(self.hi, level)
        return self._narrowed(now)

    def minute_cap(self) -> int | None:
        """The most the key's trailing minute may hold now (None: no cap beyond the level). Verifying,
        a few more than when it refused: a minute's window, full, refuses those few, not a level's
        worth on the wire."""
        return self.cap_count if self.phase == "verify" else None

    def _narrowed(self, now: float) -> bool | Settle:
        """The bracket moved: narrow enough, its lower end is held until it is proven against a bucket
        holding ``BUCKET_SECONDS`` of a limit ``LANDS`` under it (confirm); else try its middle."""
        if self.lo > 0 and self.hi <= self.lo * FINE:
            self.phase = "confirm"
            return self.tried(self.lo, now) if self.level != self.lo else False
        middle = math.sqrt(self.lo * self.hi) if self.lo > 0 and math.isfinite(self.hi) else self.level
        return self.tried(middle, now)

    def tried(self, level: float, now: float) -> bool:
        """Try ``level`` from ``now``; whether it is another level."""
        level = max(MIN_RPM, min(self.cap, level))
        changed = level != self.level
        self.before = self.level
        self.level, self.since = level, now
        return changed


def search_data(search: Search) -> dict[str, Any]:
    """``search`` as plain data (JSON: no infinities), for the run that takes it over."""
    return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in asdict(search).items()}


def search_from(data: dict[str, Any], cap: float) -> Search:
    """The search ``search_data`` made, under this run's ``cap``."""
    fields = {k: data[k] for k in Search.__dataclass_fields__ if k in data and k != "cap"}
    search = Search(cap, **fields)
    for name, missing in (("since", -math.inf), ("lo_since", -math.inf), ("hi", math.inf)):
        if getattr(search, name) is None:
            setattr(search, name, missing)
    return search
