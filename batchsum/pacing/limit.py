"""``--rpm auto``: the key's limit when nobody says it. Where the limit in force comes from, in order:
what the service states (``stated``), what the key's record remembers (``remembered``, a week at most),
else a search (``search.Search``). What it learns it learns from the key's ledger (every process on the
key together), and only the run that leads the key's search (``lead.py``) moves it: the others follow.

Once a limit is known (settled):
- a strike is a refusal episode at the pace that came after ``STRIKE_SECONDS`` of even sending at it
  (or with the service admitting steadily between episodes); refusals right after a pause with
  nothing admitted between are a storm, and lower nothing. Two strikes within ``STRIKES_WITHIN`` are
  the limit: it becomes what the service admitted over a full window of the kind the strikes' spacing
  points to (a minute, 10 s, 1 s; a bucket's over their span), and is remembered when lower;
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
from typing import Any

from .ledger import TICK, Ledger
from .search import BUCKET_SECONDS, Search, Settle, adopt_seconds, sent_evenly
from .spacing import JITTER_MARGIN, MIN_RPM, WINDOW

__all__ = ["AutoLimit", "Found", "LIMIT_SECONDS", "START_RPM", "SETTLE", "MAX_RPM"]

from .search import START_RPM  # noqa: E402  (a name of this module's too)

SETTLE = 0.99  # the pace settles this far under a limit (the spacing adds 1%: 2% under in all)
PROBE_EVERY = 600.0  # a settled limit probes upward at most this often ...
PROBE_STEP = 1.05  # ... this much above
STRIKE_SECONDS = 5.0  # a refusal after this long of even sending at the pace is a strike ...
STRIKES_WITHIN = 70.0  # ... and two this close are the limit
STEADY_ADMITTED = 5  # ... as is one with at least this many admitted since the last episode
SNAPS = (60.0, 10.0)  # the windows services count in: strikes each within SNAP_WITHIN of a whole
SNAP_WITHIN = 0.15  # number of windows after the one before are that many windows apart
LOWER = 0.98  # a limit the strikes show lower than this share of the one in force replaces it
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


def window_of(strikes: list[float]) -> float | None:
    """The kind of window the strikes point to: each came within ``SNAP_WITHIN`` of a whole number of
    that window after the one before (a fixed window refuses once full, at the same point of each),
    or None (a bucket's strikes are as far apart as it took to run dry)."""
    gaps = [b - a for a, b in zip(strikes, strikes[1:])]
    for window in SNAPS:
        if all(
            round(gap / window) >= 1 and abs(gap - round(gap / window) * window) <= SNAP_WITHIN * window for gap in gaps
        ):
            return window
    return None


def shown_by(ledger: Ledger, strikes: list[float]) -> float:
    """What the service admits a minute, by its strikes: a window's full count (each window of that
    length ending at a strike holds the whole window that refused, and at most the end of the one
    before: the least of them), or a bucket's rate from the first strike to the last."""
    window = window_of(strikes)
    if window is None:
        return ledger.admitted(strikes[0] + TICK, strikes[-1] + TICK) * WINDOW / (strikes[-1] - strikes[0])
    return min(ledger.admitted(at + TICK - window, at + TICK) for at in strikes) * WINDOW / window


class AutoLimit:
    """The limit in force under ``--rpm auto`` (``value``; None while searching), where it came from
    (``source``), the ``phase`` (climb, verify, refine while searching; settled, stated, probe), and
    what to remember (``found``, once each time a limit is found). The run that leads the key's
    search calls ``step`` with the key's ledger; the others ``follow`` what it publishes."""

    __slots__ = (
        "cap",
        "value",
        "source",
        "standing",
        "search",
        "since",
        "probe_level",
        "strikes",
        "watermark",
        "found",
        "probe_refused",
        "_wall",
    )

    def __init__(self, cap: float, remembered: Found | None = None, wall: Callable[[], float] = time.time) -> None:
        self.cap = min(cap, MAX_RPM)
        self._wall = wall
        self.value: float | None = None
        self.source = "searching"
        self.standing = "settled"  # once the search ended: settled, stated, probe, or capped
        self.search: Search | None = Search(self.cap, level=min(self.cap, START_RPM))
        self.since = -math.inf  # when the settled limit (or the probe) began, on the budget's clock
        self.probe_level = 0.0
        self.strikes: list[float] = []  # the first refused starts of recent strikes
        self.watermark = -math.inf  # refusals of starts before this are judged
        self.found: Found | None = None  # a limit to remember, not yet told to the record
        self.probe_refused = 0
        if remembered is not None:
            capped = remembered.rpm > self.cap
            self.value = min(self.cap, remembered.rpm)
            self.source = f"remembered ({remembered.describe()})" + (f", capped at {self.cap:g}" if capped else "")
            self.search = None

    @property
    def phase(self) -> str:
        """The search's phase (climb, verify, refine, confirm), or once it ended: settled, stated,
        probe, or capped (by ``auto:N``)."""
        return self.search.phase if self.search is not None else self.standing

    # -- what the pacer runs at ------------------------------------------------------------------

    def pace(self) -> float:
        """The pace to run at: under the limit once it is known, else the level being tried."""
        if self.phase == "probe":
            return max(MIN_RPM, self.probe_level * SETTLE)
        if self.search is None and self.value is not None:
            return max(MIN_RPM, self.value * SETTLE)
        return max(MIN_RPM, self.search.level if self.search is not None else START_RPM)

    def limit(self) -> float:
        """The limit in force (the plan, for the pacer's rules): the known one, else the level tried."""
        if self.phase == "probe":
            return self.probe_level
        if self.search is None and self.value is not None:
            return self.value
        return self.search.level if self.search is not None else min(self.cap, START_RPM)

    def minute_cap(self) -> int:
        """The most the key's trailing minute may hold before the next start (its starts less its
        429s): under the limit in force, or what the search allows while it verifies."""
        cap = self.search.minute_cap() if self.search is not None else None
        return cap if cap is not None else max(1, math.floor(self.limit() * SETTLE))

    def describe(self) -> str:
        """``240/min (found 2026-11-25 14:02)``, or what the search is trying."""
        if self.search is not None:
            return f"searching: trying {self.search.level:.0f}/min"
        probing = f", probing {self.probe_level:.0f}/min" if self.phase == "probe" else ""
        return f"{self.value:.0f}/min ({self.source}{probing})"

    # -- the leader's look at the key ----------------------------------------------------------------

    def begin(self, now: float) -> None:
        """The key's first start under this limit (the budget's clock): the first level's stretch and a
        settled limit's quiet begin."""
        if self.search is not None and self.search.since == -math.inf:
            self.search.since = self.search.previous = now
        if self.since == -math.inf:
            self.since = self.watermark = now

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
        """A probe: refused, the limit stays; clean through a full minute and a bucket's drain, won."""
        assert self.value is not None
        now, since = ledger.now, self.since + adopt_seconds(self.value)
        if ledger.first_refused(since) is not None:
            self.probe_refused += ledger.refusals(since, now)
            self.standing, self.since, self.watermark = "settled", now, now
            return f"the probe at {self.probe_level:.0f}/min was refused: the limit stands"
        minute_after = (math.floor(since / WINDOW) + 2) * WINDOW  # a whole minute of the clock after its start
        drained = since + BUCKET_SECONDS * self.value / max(self.probe_level - self.value, 1e-9)
        last = ledger.answered_until(since)
        if last is not None and last >= max(minute_after, drained) and sent_evenly(ledger, since, last, self.pace()):
            return self._settle(self.probe_level, "found", now)
        return None

    def _strike(self, ledger: Ledger) -> str | None:
        """Refusals at the settled pace: a storm, or strikes; two strikes are the limit."""
        assert self.value is not None
        now, pace = ledger.now, self.pace()
        while (first := ledger.first_refused(max(self.watermark, self.since + adopt_seconds(pace)))) is not None:
            resumed = ledger.first_admitted(first)
            if resumed is None:
                return None  # the episode goes on: judged when it ends
            previous = self.watermark
            self.watermark = max(resumed, first + TICK)
            steady = first - previous >= 1.0 and ledger.admitted(previous, first) >= STEADY_ADMITTED
            if not (sent_evenly(ledger, first - STRIKE_SECONDS, first, pace) or steady):
                continue
            self.strikes = [t for t in self.strikes if first - t <= STRIKES_WITHIN] + [first]
            if len(self.strikes) < 2:
                continue
            start = self.strikes[0]
            if first - start < STRIKE_SECONDS:
                continue  # too close to tell a window by: the next one will
            shown = shown_by(ledger, self.strikes)
            if shown < self.value * LOWER:
                self.strikes = []
                return self._settle(max(MIN_RPM, shown), "found", now, lowered=True)
        return None

    def _settle(self, value: float, how: str, now: float, *, lowered: bool = False) -> str:
        self.value = max(MIN_RPM, min(self.cap, value))
        self.search, self.standing, self.since, self.watermark = None, "settled", now, now
        stamp = self._wall()
        if how == "capped":  # not a finding: a run without the cap searches on from here
            self.standing, self.source = "capped", f"the cap (auto:{self.cap:g})"
            return f"the search reached the cap, {self.cap:g}/min"
        self.source = f"{how} {time.strftime('%Y-%m-%d %H:%M', time.localtime(stamp))}"
        self.found = Found(self.value, how, stamp)
        if lowered:
            return f"the service refused twice at {self.value / LOWER:.0f}/min or more; it admits {self.value:.0f}/min"
        return f"the service refused above {self.value:.0f}/min"

    def partly_found(self) -> Found | None:
        """A search that did not end (its run did): the highest level it proved, to start from."""
        if self.search is None or self.search.lo <= 0 or self.search.phase not in ("refine", "confirm"):
            return None
        return Found(self.search.lo / (1 + JITTER_MARGIN), "found in part", self._wall())

    # -- what the service states ----------------------------------------------------------------------

    def stated(self, per_minute: float, now: float) -> bool:
        """The service's trusted headers state its limit: that is the limit in force (up to the cap)."""
        value = min(self.cap, per_minute)
        if self.phase == "stated" and self.value == value:
            return False
        self.value, self.standing, self.source, self.search = value, "stated", "stated by the service", None
        self.found = Found(value, "stated", self._wall())
        return True

    def distrusted(self, now: float) -> bool:
        """The service's statements are no longer believed: a stated limit is searched again from it."""
        if self.phase != "stated" or self.value is None:
            return False
        self.search = Search.start(self.cap, now)
        self.search.level = min(self.cap, START_RPM, self.value)
        self.value, self.source = None, "searching"
        return True

    # -- handed from run to run ------------------------------------------------------------------------

    def state(self) -> str:
        """What a successor needs to take the search (or the limit) on, as JSON."""
        data: dict[str, Any] = {
            "cap": self.cap,
            "value": self.value,
            "source": self.source,
            "standing": self.standing,
            "since": None if math.isinf(self.since) else self.since,
            "probe_level": self.probe_level,
            "strikes": self.strikes,
            "watermark": None if math.isinf(self.watermark) else self.watermark,
            "probe_refused": self.probe_refused,
            "search": None if self.search is None else self.search.to_data(),
        }
        return json.dumps(data)

    def adopt(self, text: str | None, *, resume: bool = False) -> bool:
        """Take on the state another run published (a search in progress, or the limit it knows);
        whether it could be read. The cap stays this run's own. ``resume``: this run takes the lead
        over, and a level being tried is tried again from the highest one proven (the key may have
        been quiet since)."""
        if not text:
            return False
        try:
            data = json.loads(text)
            value = None if data["value"] is None else float(data["value"])
            search = None if data["search"] is None else Search.from_data(data["search"], self.cap)
            self.standing, self.source = str(data["standing"]), str(data["source"])
            self.probe_level, self.strikes = float(data["probe_level"]), [float(t) for t in data["strikes"]]
            self.since = -math.inf if data["since"] is None else float(data["since"])
            self.watermark = -math.inf if data["watermark"] is None else float(data["watermark"])
        except (ValueError, TypeError, KeyError):
            return False
        self.value = None if value is None else min(self.cap, value)
        self.search = search
        if self.standing == "capped" and value is not None and value < self.cap:
            # Another run's cap held the key there: it admitted that much; search on from it.
            self.search, self.value, self.source = Search(self.cap, level=value, since=-math.inf), None, "searching"
            search = self.search
        if search is not None:
            search.level = min(self.cap, search.lo if resume and search.lo > 0 else search.level)
            if resume:
                search.since = search.previous = -math.inf  # its stretch begins at this run's first look
        if resume:  # this run's quiet (and its probes' ten minutes) begin at its first look
            self.since = self.watermark = -math.inf
            self.standing = "settled" if self.standing == "probe" else self.standing
        return True

    @property
    def searching(self) -> bool:
        return self.search is not None
