"""``--rpm auto``: the plan's limit when nobody says it. Where the limit in force comes from, in order:
what the service states (``stated``), what the key's record remembers (``remembered``, a week at
most), else a search: a cautious start that climbs while answers come back clean, and settles under
the limit the service shows when it refuses.

The search, on the pace issue's spacing rule (every trial level is an even pace):
- climb: from ``START_RPM`` (or the cap, if lower), the level climbs by half again (``CLIMB``) each
  ``STEP_SECONDS`` of clean, unpaused sending; a level held that long is proven (``lo``), as far as
  windows of 10 s or less can tell. (A per-minute window refuses a climb when its minute is full, at
  a level of about twice its limit: what is on the wire then is the search's 429s.)
- The first refusal above ``lo`` bounds the limit from above (``hi``). If the service admitted about
  ``lo`` or more in the trailing minute, a per-minute window refused: the limit is what it admitted
  (a sliding minute holds exactly its limit then). Else a shorter window (1 s, 10 s) or a bucket
  refused early: the level drops back to ``lo`` to check (verify) until the trailing minute holds
  more than it did at the refusal (refused again first: a minute's window after all, at what it
  admitted), then bisects between ``lo`` and ``hi``, ``REFINE_SECONDS`` a step, until they are
  within ``FINE``.
- settled: the pace runs ``SETTLE`` under the limit (with the spacing's margin, 2% under). A later
  refusal after a stretch of clean sending drops the pace to what the service admitted in the
  trailing minute while it rechecks (a storm: clean again, the limit stands); a second within ten
  minutes confirms it, and the limit becomes what the service admitted since the first (fixed
  windows and buckets count differently from a sliding minute). Every ``PROBE_EVERY`` the level probes ``PROBE_STEP`` above for a
  ``PROBE_SECONDS``: clean, it is the new limit; refused, it stays (those 429s counted apart).

Invariants: the pace is never above the cap; a storm (refusals right after a pause, or at or under a
level already proven) never lowers a found limit; each trial is an even pace, so the spacing rule
holds whatever the level.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from .spacing import MIN_RPM

__all__ = ["AutoLimit", "Found", "LIMIT_SECONDS", "START_RPM", "SETTLE", "MAX_RPM"]

START_RPM = 60.0  # with nothing known, the search starts here (or at the cap, if lower) ...
CLIMB = 1.5
STEP_SECONDS = 10.0  # ... after each stretch this long of clean, unpaused sending at a level
REFINE_SECONDS = 30.0  # a bisection step's level is proven after this long (three 10 s windows; a bucket of 10 s drains in it at 4% over)
FINE = 1.04  # a bracket this narrow ends the search at its lower end
SETTLE = 0.99  # the pace settles this far under a limit (the spacing adds 1%: 2% under in all)
MINUTE_BINDS = 0.97  # a trailing minute that admitted this share of the proven level was a full minute
PROBE_EVERY = 600.0  # a settled limit probes upward at most this often ...
PROBE_STEP = 1.05  # ... this much above ...
PROBE_SECONDS = 60.0  # ... for a minute
CONTRADICTED_WITHIN = 600.0  # two contradicting refusals this close: the limit is what came between
LIMIT_SECONDS = 7 * 86400.0  # a remembered limit is a starting point for a week
MAX_RPM = 1_000_000.0  # the most a limit may be (stated or capped): beyond is not a plan


@dataclass(frozen=True)
class Found:
    """A limit and how it was known: "found" (searched for), "stated" (by the service's headers),
    "configured" (``--rpm N``); ``at``: when (Unix time)."""

    rpm: float
    how: str
    at: float

    def to_json(self) -> str:
        return json.dumps({"rpm": round(self.rpm, 3), "how": self.how})

    @classmethod
    def from_json(cls, text: str, at: float) -> Found | None:
        """The remembered value, or None when it does not read as one (an entry from a later version)."""
        try:
            data = json.loads(text)
            rpm, how = float(data["rpm"]), str(data["how"])
        except (ValueError, TypeError, KeyError):
            return None
        return cls(rpm, how, at) if MIN_RPM <= rpm <= MAX_RPM and math.isfinite(rpm) else None

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.at))
        return f"{self.how} {when}"


class Settle(NamedTuple):
    """A step of the search that ends it: the limit is ``value``, known ``how``."""

    value: float
    how: str


class Search:
    """The search's state: its ``phase`` (once the search ended, the limit's own states too: settled,
    stated, recheck, probe), the ``level`` tried and ``since`` when (the pacer's clock),
    the bracket (``lo``: the highest level proven clean; ``hi``: the lowest refused), and what the
    trailing minute must exceed for verifying to end. Its steps answer whether the level moved, or
    the limit the search ends on (``Settle``)."""

    __slots__ = ("cap", "phase", "level", "since", "lo", "hi", "verify_above")

    def __init__(self, cap: float) -> None:
        self.cap = cap
        self.phase = "climb"
        self.level = min(cap, START_RPM)
        self.lo = 0.0  # the highest level proven clean
        self.hi = math.inf  # the lowest level refused
        self.since = -math.inf  # when the level in force began (the pacer's clock)
        self.verify_above = 0  # verify holds until the trailing minute admits more than this

    def clean(self, now: float, held: float, admitted_minute: int) -> bool | Settle:
        """The level has held clean for ``held`` seconds: a step of the climb or the bisection."""
        if self.phase == "climb" and held >= STEP_SECONDS:
            self.lo = self.level
            if self.level >= self.cap:
                return Settle(self.cap, "found at the cap")
            return self.tried(min(self.cap, self.level * CLIMB), now)
        if self.phase == "verify" and held >= STEP_SECONDS and admitted_minute > self.verify_above:
            # Held, and the trailing minute admitted more than when it refused: no minute's window
            # refused then, a shorter one (or a bucket) did. Bisect up from here.
            self.lo, self.phase = self.level, "refine"
            return self._narrowed(now)
        if self.phase == "refine" and held >= REFINE_SECONDS:
            self.lo = self.level
            return self._narrowed(now)
        return False

    def earlier(self, started_at: float, level: float, admitted_minute: int) -> bool:
        """Whether a 429 is for an attempt sent at an earlier level, before the one now tried (while
        verifying, refining or probing): it bounds the limit, and what the minute held by then is
        what verifying must exceed."""
        if started_at >= self.since or self.phase not in ("verify", "refine", "probe"):
            return False
        if level > self.lo:
            self.hi = min(self.hi, level)
        if self.phase == "verify":
            self.verify_above = max(self.verify_above, admitted_minute)
        return True

    def refused(self, level: float, now: float, admitted_minute: int) -> bool | Settle:
        """A 429 at ``level`` while climbing, verifying or refining."""
        if self.phase == "climb" and level >= self.lo:
            if level <= self.lo:
                # The level just proven is refused after all (its answers were slow to come back):
                # the level before it is the proven one (none, for the first).
                self.lo = self.lo / CLIMB if self.lo > min(self.cap, START_RPM) * 1.001 else 0.0
            self.hi = min(self.hi, level)
            if self.lo > 0 and admitted_minute >= MINUTE_BINDS * self.lo:
                # A minute's window refused, full: what it admitted is the limit.
                return Settle(min(float(admitted_minute), self.hi), "found")
            # Refused before a minute was full (or before any level was proven): check the proven
            # level (or half the refused one) on its own, until the minute holds more than now.
            self.phase, self.verify_above = "verify", admitted_minute
            return self.tried(self.lo if self.lo > 0 else level / CLIMB, now)
        if self.phase == "verify":
            self.hi = min(self.hi, level)
            if self.lo > 0 or admitted_minute >= MINUTE_BINDS * level:
                # Refused again at a level the climb held (or with its minute full): a minute's
                # window, full; it admitted its limit.
                return Settle(max(MIN_RPM, min(float(admitted_minute), level)), "found")
            # Nothing proven yet (the cautious start was above the limit) and refused before the
            # minute was full: a shorter window (or a bucket) under this level too. A step lower.
            self.verify_above = max(self.verify_above, admitted_minute)
            return self.tried(level / CLIMB, now)
        if self.phase == "refine" and level > self.lo:
            self.hi = min(self.hi, level)
            return self._narrowed(now)
        return False

    def _narrowed(self, now: float) -> bool | Settle:
        """The bracket moved: narrow enough, the search ends at its lower end; else try its middle."""
        if self.hi <= self.lo * FINE:
            return Settle(self.lo, "found")
        middle = math.sqrt(self.lo * self.hi) if self.lo > 0 and math.isfinite(self.hi) else self.level
        return self.tried(middle, now)

    def start(self, now: float) -> bool:
        """The run's first start (whether it is): the first level's stretch begins."""
        if self.since != -math.inf:
            return False
        self.since = now
        return True

    def tried(self, level: float, now: float) -> bool:
        """Try ``level`` from ``now``; whether it is another level."""
        changed = level != self.level
        self.level, self.since = max(MIN_RPM, level), now
        return changed

    def restart(self, now: float, level: float) -> bool:
        """Search afresh from ``level`` (a stated limit no longer believed)."""
        self.lo, self.hi, self.phase = 0.0, math.inf, "climb"
        return self.tried(level, now)

    def settle(self, value: float, now: float) -> None:
        """The search ended on ``value``: its level, the bracket forgotten."""
        self.phase, self.since, self.level = "settled", now, value
        self.lo, self.hi = 0.0, math.inf


SEARCHING = ("climb", "verify", "refine")


class AutoLimit:
    """The limit in force under ``--rpm auto`` (``value``; None while searching), where it came from
    (``source``), and the search (``Search``: the level being tried, its bounds). The pacer tells it
    of clean answers and refusals; it answers whether the pace changed (``pace()``) and what to
    remember (``found``, once each time a limit is found)."""

    __slots__ = ("cap", "value", "source", "search", "settled_at", "contradicted_at", "found", "probe_refused", "_wall")

    def __init__(self, cap: float, remembered: Found | None = None, wall: Callable[[], float] = time.time) -> None:
        self.cap = min(cap, MAX_RPM)
        self._wall = wall
        self.value: float | None = None
        self.source = "searching"
        self.search = Search(self.cap)
        self.settled_at = -math.inf
        self.contradicted_at: float | None = None
        self.found: Found | None = None  # a limit to remember, not yet told to the record
        self.probe_refused = 0
        if remembered is not None:
            self.value = min(self.cap, remembered.rpm)
            self.source = f"remembered ({remembered.describe()})"
            self.search.phase = "settled"

    @property
    def phase(self) -> str:
        """The search's phase, or the limit's: climb, verify, refine; settled, stated, recheck, probe."""
        return self.search.phase

    # -- what the pacer runs at ------------------------------------------------------------------

    def pace(self) -> float:
        """The pace to run at: under the limit once it is known, else the level being tried."""
        if self.phase in ("settled", "stated") and self.value is not None:
            return max(MIN_RPM, self.value * SETTLE)
        return max(MIN_RPM, self.search.level)

    def limit(self) -> float:
        """The limit in force (the plan, for the pacer's rules): the known one, else the level tried."""
        known = self.value is not None and self.phase in ("settled", "stated")
        return self.value if known and self.value is not None else self.search.level

    def describe(self) -> str:
        """``240/min (found 2026-11-25 14:02)``, or what the search is trying."""
        level = self.search.level
        if self.phase in SEARCHING:
            return f"searching: trying {level:.0f}/min"
        if self.phase == "recheck":
            return f"{self.value:.0f}/min ({self.source}), rechecking at {level:.0f}/min after a 429"
        assert self.value is not None
        probing = f", probing {level:.0f}/min" if self.phase == "probe" else ""
        return f"{self.value:.0f}/min ({self.source}{probing})"

    # -- what the service showed -----------------------------------------------------------------

    def start(self, now: float) -> None:
        """The run's first start: the first level's stretch begins."""
        if self.search.start(now):
            self.settled_at = now

    def clean(self, now: float, quiet_since: float, admitted_minute: int, started_at: float | None = None) -> bool:
        """An answer came back clean at ``now`` for an attempt started at ``started_at`` (default:
        now), after unpaused sending since ``quiet_since`` (the service admitted ``admitted_minute``
        in the minute before): whether the level moves (a step of the climb or the bisection, a
        probe begun or won). A level has held as long as its starts answered clean: slow answers
        do not prove it early."""
        search = self.search
        held = (now if started_at is None else started_at) - max(search.since, quiet_since)
        if self.phase in SEARCHING:
            return self._step(search.clean(now, held, admitted_minute), now)
        if self.phase == "recheck" and held >= REFINE_SECONDS:
            search.phase, search.since, search.level = self.source_phase(), now, self.value or search.level
            return True  # clean again under it: a storm, not the limit; the limit stands
        if self.phase == "settled" and self.value is not None and self.value < self.cap:
            if now - self.settled_at >= PROBE_EVERY:
                search.phase = "probe"
                return search.tried(min(self.cap, self.value * PROBE_STEP), now)
        if self.phase == "probe" and held >= PROBE_SECONDS:
            return self._settle(search.level, "found", now)
        return False

    def refused(
        self, started_at: float, level: float, now: float, stretch: bool, admitted_minute: int, since_last: float | None
    ) -> bool:
        """A 429 for an attempt started at ``started_at`` at ``level`` (the pace then): whether the
        limit or the level changed. ``stretch``: it came after a stretch of unpaused sending (else a
        storm: nothing changes); ``admitted_minute``: what the service admitted in the minute before
        it; ``since_last``: the rate it admitted since the last contradicting refusal (None: none)."""
        if self.search.earlier(started_at, level, admitted_minute):
            return False
        if self.phase == "probe" and level > (self.value or 0):
            self.probe_refused += 1
            self.search.phase = "settled"  # the limit did not rise: keep it, probe again later
            self.settled_at = now
            return True
        if self.phase in SEARCHING:
            return self._step(self.search.refused(level, now, admitted_minute), now)
        if self.phase in ("settled", "stated", "recheck") and stretch and self.value is not None:
            return self._contradicted(now, admitted_minute, since_last)
        return False

    def source_phase(self) -> str:
        """The phase a limit known stands in: stated by the service, or settled (found, remembered)."""
        return "stated" if self.source == "stated by the service" else "settled"

    def stated(self, per_minute: float, now: float) -> bool:
        """The service's trusted headers state its limit: that is the limit in force (up to the cap)."""
        value = min(self.cap, per_minute)
        if self.phase == "stated" and self.value == value:
            return False
        self.value, self.search.phase, self.source = value, "stated", "stated by the service"
        self.found = Found(value, "stated", self._wall())
        return True

    def distrusted(self, now: float) -> bool:
        """The service's statements are no longer believed: a stated limit is searched again from it."""
        if self.phase != "stated" or self.value is None:
            return False
        return self.search.restart(now, min(self.cap, START_RPM, self.value))

    # -- steps -----------------------------------------------------------------------------------

    def _contradicted(self, now: float, admitted_minute: int, since_last: float | None) -> bool:
        """A refusal under the limit in force, after a stretch of clean sending. The first one may be
        a storm's: the pace drops to what the service admitted in the trailing minute (at least a
        step) and rechecks, and clean for ``REFINE_SECONDS`` the limit stands, unrecorded. A second
        within ``CONTRADICTED_WITHIN`` confirms it: the limit becomes what the service admitted since
        the first (or in the trailing minute, whichever is lower), and is remembered."""
        assert self.value is not None
        lowered = min(float(admitted_minute), self.value * SETTLE * SETTLE)
        first = self.contradicted_at is None or now - self.contradicted_at > CONTRADICTED_WITHIN
        self.contradicted_at = now
        if first:
            self.search.phase = "recheck"
            return self.search.tried(max(MIN_RPM, lowered), now)
        if since_last is not None and since_last > 0:
            lowered = min(lowered, since_last)
        return self._settle(max(MIN_RPM, lowered), "found", now)

    def _step(self, step: bool | Settle, now: float) -> bool:
        return self._settle(step.value, step.how, now) if isinstance(step, Settle) else step

    def _settle(self, value: float, how: str, now: float) -> bool:
        self.value = max(MIN_RPM, min(self.cap, value))
        self.settled_at = now
        self.search.settle(self.value, now)
        stamp = self._wall()
        self.source = f"{how} {time.strftime('%Y-%m-%d %H:%M', time.localtime(stamp))}"
        self.found = Found(self.value, "found", stamp)
        return True
