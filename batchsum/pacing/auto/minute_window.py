"""What a minute's window shows when it refuses, read off the key's ledger: the count it held. A
sliding minute holds exactly its limit in the minute before a refusal; a fixed one (from its first
request, or on the clock) holds its limit from its start, which the trailing minute may overrun into
the window before: its start is told by the reset that ends a long spell with nothing admitted.

Invariant: each count is of starts the service admitted (answered clean), never of what a run sent.
"""

from __future__ import annotations

from ..budgets.ledger import TICK, Ledger
from ..budgets.spacing import WINDOW

__all__ = ["minute_reset", "window_count", "minute_refused", "FIXED_GAP", "FIXED_RESET", "QUIET_SECONDS"]

FIXED_GAP = 5.0  # a refusal followed by this long with nothing admitted: a fixed window, full until it reset
FIXED_RESET = 15.0  # ... and this long: a minute's (a 10 s window resets sooner)
RESET_SLACK = 1.0  # the resume comes a second or so after the reset (the 429's answer, a Retry-After in seconds)
QUIET_SECONDS = 2.0  # a start after this long with none (and ``QUIET_INTERVALS`` of the pace) begins a
QUIET_INTERVALS = 4  # spell of sending: a new run's first, not the next of an even pace


def resumed_after(ledger: Ledger, first: float | None) -> float | None:
    """The first start admitted after the refusal at ``first`` (its tick's own starts went before it)."""
    return None if first is None else ledger.first_admitted(first + TICK)


def minute_reset(ledger: Ledger, first: float | None, held: int, whole_minute: bool) -> int | None:
    """After the first refusal (at ``first``, its trailing minute having admitted ``held``) the service
    admitted nothing until long after: a minute's window was full until it reset; the limit it shows,
    or None (no such reset). When the key had sent for less than a minute before the refusal, the
    window held everything it sent (``held``); else it began a minute before that reset, and what it
    admitted from then until the refusal is its limit."""
    resumed = resumed_after(ledger, first)
    if first is None or resumed is None or resumed - first < FIXED_RESET:
        return None
    if not whole_minute:
        return held
    return min(held, ledger.admitted(resumed - WINDOW - RESET_SLACK, first + TICK))


def window_count(ledger: Ledger, first: float | None, at: float, trailing: int) -> int:
    """What a minute's window admitted when it refused again at ``at`` (after the first refusal at
    ``first``): the trailing minute's count, unless the service admitted nothing for a while after
    the first refusal (a fixed window, full until it reset): then what it admitted since it did."""
    resumed = resumed_after(ledger, first)
    if first is None or resumed is None or resumed >= at or resumed - first < FIXED_GAP:
        return trailing
    return min(trailing, ledger.admitted(resumed, at))


def minute_refused(ledger: Ledger, first: float, interval: float) -> int | None:
    """One refusal at ``first`` (of a known limit's even pace, ``interval`` apart), then nothing
    admitted until a minute's window reset: what that window admitted, or None when the ledger does
    not show one. The window began a minute before the resume. It shows itself either way a minute's
    window can: the key's first start after a quiet spell opened it (a sliding minute, or a fixed one
    from its first request, refusing a run that began in it: what the minute before admitted, under
    the plan before, does not count, as a sliding minute's reset says it left the window); or the
    minute before it admitted no more than it did (a fixed minute on the clock, the key sending into
    it from the one before). A refusal that came while the key sent evenly through the window's
    beginning, at a pace the minute before admitted, is not read here (an outage's long Retry-After
    looks the same): the strikes judge it."""
    resumed = resumed_after(ledger, first)
    if resumed is None or resumed - first < FIXED_RESET:
        return None
    opened = resumed - WINDOW - RESET_SLACK  # (the window began up to RESET_SLACK after it)
    began = ledger.first_admitted(opened - RESET_SLACK)
    if began is not None and began <= opened + 2 * RESET_SLACK + TICK:
        quiet = max(QUIET_SECONDS, QUIET_INTERVALS * interval)
        if ledger.started(began - quiet, began) == 0:  # the window opened with the first start of a spell
            return ledger.admitted(min(began, opened), first + TICK)
    if ledger.started(opened - WINDOW, opened) == 0:
        return None
    held = ledger.admitted(opened, first + TICK)
    return held if ledger.admitted(opened - WINDOW, opened) <= held else None
