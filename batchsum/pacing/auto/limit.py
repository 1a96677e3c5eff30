"""``--rpm auto``: the key's limit when nobody says it. Where the limit in force comes from, in order:
what the service states (``stated``), what the key's record remembers (``remembered``, a week at most),
else a search (``search.Search``). What it learns it learns from the key's ledger (every process on the
key together), and only the run that leads the key's search (``search_lead.py``) moves it: the others follow.

Once a limit is known (settled):
- a strike is a refusal episode at the pace that came after 5 s of even sending at it (or with the
  service admitting steadily between episodes); refusals right after a pause with nothing admitted
  between are a storm, and lower nothing. Two strikes within 70 s are the limit (``strikes.py``): it
  becomes what the service admitted over a full window of the kind the strikes' spacing points to (a
  minute, 10 s; a bucket's rate over their span), and is remembered when lower;
- every ``PROBE_EVERY`` of clean sending the level probes ``PROBE_STEP`` above for long enough that
  every window kind would refuse it (a full minute on the budget's clock after its first start, and a
  bucket's drain time at its excess): clean through, it is the new limit; refused, it stays (those
  429s counted apart).

Invariants: the pace is never above the cap; the cap is not a finding (a run capped by ``auto:N``
never remembers N); what is remembered is what the service showed (a level it admitted, a window's
count), never what a run throttled itself to; a storm never lowers a limit.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..budgets.ledger import Ledger
from ..budgets.spacing import JITTER_MARGIN, MIN_RPM, WINDOW
from .search import Search, Settle, adopt_seconds, probed, sent_evenly
from .sources import BY_HEADERS, CAPPED, FOLLOWED, FOUND, IN_PART, LOWERED, PROBED, REMEMBERED, STATED, Source, known
from .strikes import Strikes

__all__ = ["AutoLimit", "Found", "stated", "heard", "distrusted", "LIMIT_SECONDS", "START_RPM", "SETTLE", "MAX_RPM"]

from .search import START_RPM  # noqa: E402  (a name of this module's too)

SETTLE = 0.99  # the pace settles this far under a limit (the spacing adds 1%: 2% under in all)
PROBE_EVERY = 600.0  # a settled limit probes upward at most this often ...
PROBE_STEP = 1.05  # ... this much above
LOWER = 0.98  # a limit the strikes show lower than this share of the one in force replaces it
LIMIT_SECONDS = 7 * 86400.0  # a remembered limit is a starting point for a week
MAX_RPM = 1_000_000.0  # the most a limit may be (stated or capped): beyond is not a plan
MIN_SENDING = 0.01  # the least share of the key's pace its runs are taken to send together


@dataclass(frozen=True)
class Found:
    """A limit and how it was known (``sources``: ``found`` by a search, ``found in part``,
    ``lowered`` by refusals, ``probed``, ``stated`` by the service's headers); ``at``: when (Unix time)."""

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
        """``found 2026-11-26 14:02 by a search``."""
        return known(self.how, self.at)


class AutoLimit:
    """The limit in force under ``--rpm auto`` (``value``; None while searching), where it came from
    (``origin``; ``source`` with a search's level), the ``phase``, and what to remember (``found``,
    once each time a limit is found); ``heard``: the per-minute limit this run's own answers last
    stated. The run leading the key's search calls ``step`` with the key's ledger; the others take
    on what it publishes (``handover.py``)."""

    def __init__(self, cap: float, remembered: Found | None = None, wall: Callable[[], float] = time.time) -> None:
        self.cap = min(cap, MAX_RPM)
        self.wall = wall
        self.value: float | None = None
        self.origin = Source.searching()
        self.heard: float | None = None
        self.sending = 1.0  # what the runs on the key may send together, a share of its pace (at most 1)
        self.standing = "settled"  # once the search ended: settled, stated, probe, or capped
        self.search: Search | None = Search(self.cap, level=min(self.cap, START_RPM))
        self.since = -math.inf  # when the settled limit (or the probe) began, on the budget's clock
        self.probe_level = 0.0
        self.strikes = Strikes()
        self.found: Found | None = None  # a limit to remember, not yet told to the record
        self.probe_refused = 0
        if remembered is not None:
            capped = remembered.rpm > self.cap
            self.value = min(self.cap, remembered.rpm)
            kind = CAPPED if capped else REMEMBERED
            self.origin = Source(kind, remembered.how, remembered.at, self.cap if capped else None)
            self.search = None

    @property
    def source(self) -> Source:
        """Where the limit in force came from (while searching, with the level tried)."""
        return Source.searching(self.search.level) if self.search is not None else self.origin

    @property
    def phase(self) -> str:
        """The search's phase (climb, verify, refine, confirm), or its end's: settled, stated, probe, capped."""
        return self.search.phase if self.search is not None else self.standing

    def limit(self) -> float:
        """The limit in force (the plan for the pacer's rules): the known one, a probe's, or the level tried."""
        if self.search is not None or self.value is None:
            return self.search.level if self.search is not None else min(self.cap, START_RPM)
        return self.probe_level if self.standing == "probe" else self.value

    def pace(self) -> float:
        """The key's pace: under the limit once it is known; while searching, the pace at which the
        runs on the key, each at its share of it, send the level being tried together (a run with
        ``--share 0.5`` alone on the key paces the key at twice the level: it sends the level)."""
        if self.search is not None:
            return max(MIN_RPM, min(self.cap, self.search.level / max(self.sending, MIN_SENDING)))
        return max(MIN_RPM, self.limit() * SETTLE)

    def ceiling(self) -> float:
        """The most the key's pace may be now (the pacer's ceiling): the limit, or while searching
        the pace that sends the level."""
        return max(self.limit(), self.pace())

    def minute_cap(self) -> int:
        """The most the key's trailing minute may hold before the next start (its starts less its
        429s): under the limit in force, or what the search allows while it verifies."""
        cap = self.search.minute_cap() if self.search is not None else None
        return cap if cap is not None else max(1, math.floor(self.limit() * SETTLE))

    def describe(self) -> str:
        """``240/min (found 2026-11-25 14:02 by a search, in this run)``, or what the search is trying."""
        if self.search is not None:
            return f"searching: trying {self.search.level:.0f}/min"
        probing = f", probing {self.probe_level:.0f}/min" if self.phase == "probe" else ""
        return f"{self.value:.0f}/min ({self.origin.detail()}{probing})"

    def begin(self, now: float) -> None:
        """The key's first start under this limit (the budget's clock): the first level's stretch and a
        settled limit's quiet begin."""
        if self.search is not None and self.search.since == -math.inf:
            self.search.since = now
        if self.since == -math.inf:
            self.since = now
            self.strikes.clear(now)

    def step(self, ledger: Ledger) -> str | None:
        """One look at the key's ledger: why the limit in force or the level moved, or None."""
        now = ledger.now
        self.begin(now)
        if self.search is not None:
            moved = self.search.step(ledger)
            if isinstance(moved, Settle):
                return self._settle(moved.value, moved.how, now)
            return "answers came back clean" if moved else None
        if self.phase == "probe":
            return self._probe(ledger)
        why = self._strike(ledger)
        if why is None and self.phase == "settled" and self.value is not None and self.value < self.cap:
            if now - self.since >= PROBE_EVERY and sent_evenly(ledger, now - WINDOW, now, self.pace()):
                self.standing, self.probe_level = "probe", min(self.cap, self.value * PROBE_STEP)
                self.since = now
                return f"probing {self.probe_level:.0f}/min: the plan may have been raised"
        return why

    def _probe(self, ledger: Ledger) -> str | None:
        """A probe: refused, the limit stays; clean for long enough, it is the new limit."""
        assert self.value is not None
        outcome = probed(ledger, self.since + adopt_seconds(self.value), self.value, self.probe_level, self.pace())
        if outcome is None:
            return None
        if outcome:
            return self._settle(self.probe_level, PROBED, ledger.now)
        self.probe_refused += ledger.refusals(self.since, ledger.now)
        self.standing, self.since = "settled", ledger.now
        self.strikes.clear(ledger.now)
        return f"the probe at {self.probe_level:.0f}/min was refused: the limit stands"

    def _strike(self, ledger: Ledger) -> str | None:
        """Refusals at the settled pace: a storm, or strikes; two strikes show a lower limit."""
        assert self.value is not None
        pace = self.pace()
        shown = self.strikes.shown(ledger, self.since + adopt_seconds(pace), pace)
        if shown is None or shown >= self.value * LOWER:
            return None
        return self._settle(max(MIN_RPM, shown), LOWERED, ledger.now, lowered=self.value)

    def _settle(self, value: float, how: str, now: float, *, lowered: float | None = None) -> str:
        self.value = max(MIN_RPM, min(self.cap, value))
        self.search, self.standing, self.since = None, "settled", now
        self.strikes.clear(now)
        stamp = self.wall()
        if how == "capped":  # not a finding: a run without the cap searches on from here
            self.standing, self.origin = "capped", Source(CAPPED, cap=self.cap)
            return f"the search reached the cap, {self.cap:g}/min"
        self.origin = Source(FOUND, how, stamp)
        self.found = Found(self.value, how, stamp)
        if lowered is not None:
            return f"the service refused at {lowered:.0f}/min, admitting {self.value:.0f}/min over a full window"
        return f"the service refused above {self.value:.0f}/min"

    def partly_found(self) -> Found | None:
        """A search that did not end (its run did): the highest level it proved, to start from."""
        if self.search is None or self.search.lo <= 0 or self.search.phase not in ("refine", "confirm"):
            return None
        return Found(self.search.lo / (1 + JITTER_MARGIN), IN_PART, self.wall())

    @property
    def searching(self) -> bool:
        return self.search is not None


# What the service's headers state, as the limit in force: the answers' part (``lessons.Answers``).


def stated(auto: AutoLimit, per_minute: float) -> bool:
    """The service's trusted headers state its limit: that is the limit in force (up to the cap), this
    run's own (``stated``); whether that is news."""
    value = min(auto.cap, per_minute)
    auto.heard = per_minute
    if auto.phase == "stated" and auto.value == value and auto.origin.kind == STATED:
        return False
    stamp = auto.wall()
    auto.value, auto.standing, auto.origin, auto.search = value, "stated", Source(STATED, BY_HEADERS, stamp), None
    auto.found = Found(value, BY_HEADERS, stamp)
    return True


def heard(auto: AutoLimit, per_minute: float) -> None:
    """This run's own answers state ``per_minute`` (trusted headers): a limit followed from another
    run, which its service stated, is stated to this run too when the value is the same."""
    auto.heard = per_minute
    origin = auto.origin
    if origin.kind == FOLLOWED and origin.how == BY_HEADERS and auto.value is not None:
        if math.isclose(auto.value, min(auto.cap, per_minute)):
            auto.origin = Source(STATED, BY_HEADERS, origin.at)


def distrusted(auto: AutoLimit) -> bool:
    """The service's statements are no longer believed: a stated limit is searched again from it."""
    if auto.phase != "stated" or auto.value is None:
        return False
    auto.search, auto.value, auto.origin = (
        Search(auto.cap, level=min(auto.cap, START_RPM, auto.value)),
        None,
        Source.searching(),
    )
    auto.heard = None
    return True
