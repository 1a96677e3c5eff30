"""Refusals at a known limit's pace, told apart: a storm (refusals right after a pause, nothing admitted
between them) changes nothing; a strike is a refusal after a stretch of even sending at the pace, or
with the service admitting steadily since the last one; two strikes close together are the limit, and
show what the service admits; so does one strike that a minute's window refused, full until it reset
(``minute_window.minute_refused``): a run that meets a plan lowered to half on a minute's window draws one
refusal, pauses and may end before a second.

Invariant: refusals are judged once each, in the order of their starts, and only when their episode
has ended (a start admitted after them); a storm never makes a strike; what a strike shows is what
the service admitted over a full window that refused.
"""

from __future__ import annotations

import math

from ..budgets.ledger import TICK, Ledger
from ..budgets.spacing import WINDOW
from .minute_window import minute_refused
from .search import sent_evenly

__all__ = ["Strikes", "window_of", "shown_by", "STRIKE_SECONDS", "STRIKES_WITHIN"]

STRIKE_SECONDS = 5.0  # a refusal after this long of even sending at the pace is a strike ...
STEADY_ADMITTED = 5  # ... as is one with at least this many admitted since the last episode ...
STRIKES_WITHIN = 70.0  # ... and two this close are the limit
SNAPS = (60.0, 10.0)  # the windows services count in: strikes each a whole number of windows after the
EARLY, LATE = 0.15, 0.25  # one before, less EARLY or more LATE of one (the pause after each runs late)


def window_of(strikes: list[float]) -> float | None:
    """The kind of window the strikes point to: each came about a whole number of that window after the
    one before (a fixed window refuses once full, at the same point of each, give or take how late the
    pause after the last refusal let the sending resume), or None (a bucket's strikes are as far apart
    as it took to run dry; read as a window's, they show about the same)."""
    gaps = [b - a for a, b in zip(strikes, strikes[1:])]
    for window in SNAPS:
        counts = [math.floor(gap / window + EARLY) for gap in gaps]
        if all(n >= 1 and -EARLY * window <= gap - n * window <= LATE * window for n, gap in zip(counts, gaps)):
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


class Strikes:
    """The strikes of the last ``STRIKES_WITHIN`` seconds (their first refused starts), and the
    ``watermark``: refusals of starts before it are judged."""

    __slots__ = ("times", "watermark")

    def __init__(self, times: list[float] | None = None, watermark: float = -math.inf) -> None:
        self.times = times or []
        self.watermark = watermark

    def shown(self, ledger: Ledger, since: float, pace: float) -> float | None:
        """Judge the refusals of starts from ``since`` on at ``pace``: what the service admits a minute
        when two strikes show it, else None."""
        while (first := ledger.first_refused(max(self.watermark, since))) is not None:
            resumed = ledger.first_admitted(first)
            if resumed is None:
                return None  # the episode goes on: judged when it ends
            previous = self.watermark
            self.watermark = max(resumed, first + TICK)
            steady = first - previous >= 1.0 and ledger.admitted(previous, first) >= STEADY_ADMITTED
            if not (sent_evenly(ledger, first - STRIKE_SECONDS, first, pace) or steady):
                continue  # right after a pause, nothing admitted between: a storm's
            self.times = [t for t in self.times if first - t <= STRIKES_WITHIN] + [first]
            if first - self.times[0] >= STRIKE_SECONDS:  # closer, too close to tell a window by
                return shown_by(ledger, self.times)
            full = minute_refused(ledger, first, WINDOW / pace)
            if full is not None:  # a minute's window, full until it reset: what it admitted
                return float(full)
        return None

    def clear(self, now: float) -> None:
        """Start afresh from ``now`` (a limit settled, a probe ended)."""
        self.times, self.watermark = [], now
