"""The key's ledger: its starts, clean answers and 429s per tenth of a second, every process and
machine on the key together, as its budget counts them: a start when it is committed, an answer by the
tick of the start it answers. ``--rpm auto`` judges the key by it, never by one process's share.

Invariant: a count is never moved between ticks once written (late answers add to the tick of their
start), so any span's counts only grow, and two readers of one budget see the same history.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import accumulate

__all__ = ["Ledger", "Tally", "TICK", "KEEP_TICKS", "tick_of", "LEDGER_SECONDS"]

TICK = 0.1  # seconds a count covers
KEEP_TICKS = 1800  # ticks kept (three minutes): what a minute's evidence and a takeover need
LEDGER_SECONDS = 150.0  # what a reader asks for: the trailing minute of a refusal two minutes back, and more


def tick_of(when: float) -> int:
    """The tick holding ``when`` (an instant on the budget's clock)."""
    return math.floor(when / TICK + 1e-9)


@dataclass(frozen=True)
class Tally:
    """One tick's counts."""

    tick: int
    starts: int = 0
    answered: int = 0
    refused: int = 0


def _prefix(values: list[int]) -> list[int]:
    return [0, *accumulate(values)]


@dataclass(frozen=True)
class Ledger:
    """The key's counts from ``first`` (a tick) up to ``now`` (the budget's clock when read), with sums
    over any span of them. A tick outside what was read counts as nothing."""

    now: float
    first: int
    starts: list[int]
    answered: list[int]
    refused: list[int]
    _sums: dict[str, list[int]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, now: float, tallies: list[Tally], seconds: float = LEDGER_SECONDS) -> Ledger:
        """The ledger of the ``seconds`` before ``now`` from the budget's ``tallies`` (any order)."""
        first = tick_of(now - seconds)
        size = max(0, tick_of(now) - first + 1)
        starts, answered, refused = [0] * size, [0] * size, [0] * size
        for tally in tallies:
            at = tally.tick - first
            if 0 <= at < size:
                starts[at] += tally.starts
                answered[at] += tally.answered
                refused[at] += tally.refused
        return cls(now, first, starts, answered, refused)

    @classmethod
    def empty(cls, now: float) -> Ledger:
        return cls.of(now, [], 0.0)

    def _sum(self, name: str, since: float, before: float) -> int:
        """The counts of [since, before): whole ticks, and of the ticks at its edges the share the span
        covers (starts are evenly spaced, so a tick's share of a span holds about that share of its
        starts), rounded to the nearest whole count."""
        if before <= since:
            return 0
        values = getattr(self, name)
        sums = self._sums.get(name)
        if sums is None:
            sums = self._sums[name] = _prefix(values)
        size = len(values)
        a, b = since / TICK - self.first, before / TICK - self.first
        whole_a, whole_b = min(size, max(0, math.ceil(a - 1e-9))), min(size, max(0, math.floor(b + 1e-9)))
        if whole_b < whole_a:  # within one tick
            at = math.floor(a)
            return round(values[at] * (b - a)) if 0 <= at < size else 0
        total = float(sums[whole_b] - sums[whole_a])
        if 0 < whole_a <= size and whole_a - a > 1e-9:
            total += values[whole_a - 1] * (whole_a - a)
        if 0 <= whole_b < size and b - whole_b > 1e-9:
            total += values[whole_b] * (b - whole_b)
        return round(total)

    def started(self, since: float, before: float) -> int:
        """Starts committed in [since, before) (whole ticks: the tick holding ``since`` and on)."""
        return self._sum("starts", since, before)

    def admitted(self, since: float, before: float) -> int:
        """Starts in [since, before) answered clean (by now): what the service surely admitted."""
        return self._sum("answered", since, before)

    def refusals(self, since: float, before: float) -> int:
        """Starts in [since, before) answered 429."""
        return self._sum("refused", since, before)

    def pending(self, since: float, before: float) -> int:
        """Starts in [since, before) not answered yet (on the wire, or not yet told to the budget)."""
        return max(0, self.started(since, before) - self.admitted(since, before) - self.refusals(since, before))

    def answered_until(self, since: float) -> float | None:
        """The latest tick end up to which every start from ``since`` on has been answered (clean or
        429), or None: what has been judged, however the answers' order (a slow answer to an early
        start holds back a quick one to a later start)."""
        started = ended = 0
        last = None
        for at in range(max(0, tick_of(since) - self.first), len(self.starts)):
            started += self.starts[at]
            ended += self.answered[at] + self.refused[at]
            if ended >= started and started:
                last = (self.first + at + 1) * TICK
        return last

    def first_refused(self, since: float) -> float | None:
        """When the first start at or after ``since`` that was answered 429 started (its tick's
        beginning), or None."""
        start = max(0, tick_of(since) - self.first)
        for at in range(start, len(self.refused)):
            if self.refused[at]:
                return (self.first + at) * TICK
        return None

    def last_admitted(self, since: float) -> float | None:
        """When the last start at or after ``since`` answered clean started (its tick's end), or None."""
        start = max(0, tick_of(since) - self.first)
        for at in range(len(self.answered) - 1, start - 1, -1):
            if self.answered[at]:
                return (self.first + at + 1) * TICK
        return None

    def first_admitted(self, since: float) -> float | None:
        """When the first start at or after ``since`` answered clean started (its tick's beginning)."""
        start = max(0, tick_of(since) - self.first)
        for at in range(start, len(self.answered)):
            if self.answered[at]:
                return (self.first + at) * TICK
        return None
