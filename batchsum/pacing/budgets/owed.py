"""``Owed``: the news a pacer has for its key's budget and has not told yet, and the budget's state
as it last saw it.
"""

from __future__ import annotations

from .exchange import Report, Slot

__all__ = ["Owed"]


class Owed:
    """What a pacer owes its budget, told with its next exchange (its own pause, the pace it set,
    the starts answered clean and answered 429 since), and what it last saw there (to tell others'
    news from its own). Starts are the budget's to count: it commits them; a start reserved ahead
    on a far budget, never committed, is told here once it went out (``started``)."""

    __slots__ = ("pause", "pace", "answered", "refused", "started", "seen", "pace_version", "pause_mark")

    def __init__(self) -> None:
        self.pause = False  # our own pause, not yet told
        self.pace: str | None = None  # our own pace, not yet told: "lowered" (always applies) or "climbed"
        self.answered: list[float] = []  # start times (our clock) of attempts answered clean, not yet told
        self.refused: list[float] = []  # start times of attempts answered 429, not yet told
        self.started: list[float] = []  # start times of starts reserved ahead that went out, not yet told
        self.seen: Slot | None = None  # the budget's state at the last exchange
        self.pace_version = 0
        self.pause_mark: float | None = None

    def __bool__(self) -> bool:
        return bool(self.pause or self.pace or self.answered or self.refused or self.started)

    def take(self, now: float, pause_for: float, pause_reason: str | None, pace: float | None) -> Report:
        """The report of what is owed at ``now`` (``pace``: the pace in force, None without pacing);
        owed no more."""
        report = Report(
            pause_for=pause_for if self.pause else 0.0,
            pause_reason=pause_reason if self.pause else None,
            pace=pace if self.pace else None,
            pace_base=self.pace_version if self.pace == "climbed" else None,
            answered=tuple(max(0.0, now - at) for at in self.answered),
            refused=tuple(max(0.0, now - at) for at in self.refused),
            started=tuple(max(0.0, now - at) for at in self.started),
        )
        self.pause, self.pace = False, None
        self.answered, self.refused, self.started = [], [], []
        return report

    def untold(self, report: Report, at: float) -> None:
        """``report``, taken at ``at``, never reached the budget (the call failed or was cancelled):
        owed again."""
        self.pause = self.pause or bool(report.pause_for)
        if report.pace is not None and self.pace is None:
            self.pace = "climbed" if report.pace_base is not None else "lowered"
        self.answered[:0] = [at - age for age in report.answered]
        self.refused[:0] = [at - age for age in report.refused]
        self.started[:0] = [at - age for age in report.started]
