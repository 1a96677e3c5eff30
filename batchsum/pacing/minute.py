"""What a minute's window shows when it refuses, read off the key's ledger: the count it held. A
sliding minute holds exactly its limit in the minute before a refusal; a fixed one (from its first
request, or on the clock) holds its limit from its start, which the trailing minute may overrun into
the window before: its start is told by the reset that ends a long spell with nothing admitted.

Invariant: each count is of starts the service admitted (answered clean), never of what a run sent.
"""

from __future__ import annotations

from .ledger import TICK, Ledger
from .spacing import WINDOW

__all__ = ["minute_reset", "window_count", "minute_refused", "FIXED_GAP", "FIXED_RESET"]

FIXED_GAP = 5.0  # a refusal followed by this long with nothing admitted: a fixed window, full until it reset
FIXED_RESET = 15.0  # ... and this long: a minute's (a 10 s window resets sooner)
RESET_SLACK = 1.0  # the resume comes a second or so after the reset (the 429's answer, a Retry-After in seconds)


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


def minute_refused(ledger: Ledger, first: float) -> int | None:
    """One refusal at ``first`` (of a known limit's even pace), then nothing admitted until a minute's
    window reset: what that window admitted, or None when the ledger does not show one. The window
    began a minute before the resume. It shows itself either way a minute's window can: the key sent
    nothing in the minute before it and its first start opened it (a sliding minute, or a fixed one
    from its first request, refusing a run that began in it); or the minute before it admitted no
    more than it did (a fixed minute on the clock, the key sending into it from the one before). A
    refusal that came while the key sent through the minute before at a pace that minute admitted is
    not read here (an outage's long Retry-After looks the same): the strikes judge it."""
    resumed = resumed_after(ledger, first)
    if resumed is None or resumed - first < FIXED_RESET:
        return None
    opened = resumed - WINDOW - RESET_SLACK
    held = ledger.admitted(opened, first + TICK)
    before = ledger.admitted(opened - WINDOW, opened)
    if ledger.started(opened - WINDOW, opened) == 0:
        began = ledger.first_admitted(opened)
        return held if began is not None and began <= opened + 2 * RESET_SLACK + TICK else None
    return held if before <= held else None
