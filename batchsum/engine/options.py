"""How a batch runs (``RunOptions``): checked values, passed down to the engine (``RunOptions.of`` checks
the engine's own keywords), and the names of the long-text policies it takes (``SKIP``, ``SPLIT``,
``TRUNCATE``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..pacing import KeyRecord, Limiter, PaceChange, PaceLog, Pacer
from ..pacing.budgets.budget import Budget, Share
from ..pacing.budgets.presence import Presence
from ..service.errors import InvalidParameterError
from ..service.settings import (
    DEFAULT_BUDGET_WAIT,
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_MAX_WAIT,
    DEFAULT_WINDOW,
    DEFAULT_WINDOW_BYTES,
    LONG_TEXT_POLICIES,
    check_choice,
    check_flag,
    check_limiter,
    check_rate,
    check_seconds,
    check_whole,
)

__all__ = ["RunOptions", "SKIP", "SPLIT", "TRUNCATE", "SET_ELSEWHERE"]

SKIP, SPLIT, TRUNCATE = LONG_TEXT_POLICIES

# The run options (``run.options_table.OPTIONS``) that ``summarize_stream`` does not take as keywords,
# each with where it is set instead: a low-level entry is given its client and its answer store made.
# It takes the others: the request's (mode, percentage, type), RunOptions' fields, share and quota.
SET_ELSEWHERE: dict[str, str] = {
    "output_column": "its rows are RowResult objects, with no column: name them where you write them",
    "api_key": "the client's (AsyncClient(api_key=...)); several keys: lanes=",
    "base_url": "the client's (AsyncClient(base_url=...))",
    "local": "start batchsum.local.LocalService and give the client its url",
    "timeout": "the client's (AsyncClient(timeout=...))",
    "max_retries": "the client's (AsyncClient(max_retries=...))",
    "encoding": "the client's (AsyncClient(encoding=...))",
    "journal": "open the journal (batchsum.data.journal.Journal(path)) and give it as store=",
    "refresh": "it sends what its store= does not hold: give a store without those answers",
    "store_scope": "open the store in that scope (batchsum.data.scopes.open_store(..., scope=)) and give it as store=",
    "progress": "it draws nothing: stats= and on_result= say how it goes (batchsum.Run draws a bar)",
    "report": "it writes nothing: stats= holds its counts (batchsum.Run writes a report)",
    "sample": "give sample_rows=, the input positions to send",
    "keys": "give lanes=, one engine.KeyLane a key, each with its client and pacer",
}


@dataclass(frozen=True)
class RunOptions:
    """How a batch runs: values checked where they entered (a ``RunSpec``'s, or ``RunOptions.of``: the
    engine's own keywords), passed down and not checked again (``__post_init__`` asserts their types).

    ``rpm``: the plan's requests per minute (0 = no pacing; with ``auto``, only a cap on the limit
    found, stated or remembered: ``pacing.auto.limit``). ``concurrency``: a cap on requests in
    flight; None sizes it from the pace and the measured latency. ``limiter``: your own floor
    under the pace (``async acquire()``) instead of ``AsyncLimiter(1, 60/rpm)``. ``budget``: the
    key's rate budget shared with other batches, processes or machines (``budget.open_budget``;
    None: a private one for this batch). ``window``: rows held between reading and yielding.
    ``drain_seconds``: how long a stop waits for answers on the wire. ``max_wait``: how long a
    request may wait out the service's 429s (each costs no attempt) before its row fails.
    ``budget_wait``: how long the batch waits for a budget it cannot reach mid-run before it stops.
    ``window_bytes``: the input bytes those rows stand for (``RowBlock.nbytes``, else their texts'):
    reading waits while either bound is reached, so a row held back by a long retry keeps neither the
    reading nor the memory going. ``long_texts``: what a text over the word limit gets: "skip",
    "split" (in parts, then reduced)
    or "truncate" (its first words).
    ``max_requests``: the cap on paid requests (a 429 is not paid); reached, the batch stops with
    ``RequestCapReached`` after giving every row a record. ``sample_rows``: the input positions
    (0-based) to send; the other rows are ``failed`` with ``not_sent``. ``record``: what the key's
    budget remembers of the key at its service (``pacing.KeyRecord``): a key it proved answered in
    this mode within a day starts at the pace with the rest, any other sends its first request
    alone (a wrong key costs one request); the run adds what it sees (answered, refused).
    """

    rpm: float = 0.0
    auto: bool = False
    concurrency: int | None = None
    limiter: Limiter | None = None
    budget: Budget | None = None
    window: int = DEFAULT_WINDOW
    window_bytes: int = DEFAULT_WINDOW_BYTES
    drain_seconds: float = DEFAULT_DRAIN_SECONDS
    max_wait: float = DEFAULT_MAX_WAIT
    budget_wait: float = DEFAULT_BUDGET_WAIT
    long_texts: str = SKIP
    max_requests: int | None = None
    sample_rows: frozenset[int] | None = None
    record: KeyRecord | None = None

    def __post_init__(self) -> None:
        assert isinstance(self.rpm, float) and 0 <= self.rpm < math.inf, self.rpm
        assert self.budget is None or isinstance(self.budget, Budget), self.budget
        assert self.long_texts in LONG_TEXT_POLICIES, self.long_texts

    @classmethod
    def of(cls, **settings: Any) -> RunOptions:
        """The engine's own keywords (``summarize_stream(..., rpm=600, budget_wait=30)``) checked, each
        by its setting's one check (``service.settings``), where they enter; a batch is paced only when
        ``rpm`` says (0 by default). ``InvalidParameterError`` naming a bad one, or a run option set
        elsewhere (``SET_ELSEWHERE``: where)."""
        for name in settings:
            if name in SET_ELSEWHERE:
                raise InvalidParameterError(f"summarize_stream takes no {name}: {SET_ELSEWHERE[name]}")
        if "rpm" in settings:  # a number, auto or auto:N, as the option takes it
            rate = check_rate(settings["rpm"])
            settings["rpm"], settings["auto"] = rate.rpm, rate.auto or check_flag("auto", settings.get("auto", False))
        checks: dict[str, Callable[[Any], Any]] = {
            "max_requests": lambda v: check_whole("max_requests", v, minimum=0, allow_none=True),  # 0: a part's
            "concurrency": lambda v: check_whole("concurrency", v, allow_none=True),
            "window": lambda v: check_whole("window", v),
            "window_bytes": lambda v: check_whole("window_bytes", v),
            "drain_seconds": lambda v: check_seconds("drain_seconds", v, zero=True),
            "max_wait": lambda v: check_seconds("max_wait", v, zero=True),
            "budget_wait": lambda v: check_seconds("budget_wait", v, zero=True),
            "long_texts": lambda v: check_choice("long_texts", v, LONG_TEXT_POLICIES),
            "limiter": check_limiter,
            "budget": _budget,
        }
        return cls(**{name: checks[name](value) if name in checks else value for name, value in settings.items()})

    def pacer(
        self,
        on_pace_change: Callable[[PaceChange], None] | None = None,
        share: Share | None = None,
        *,
        alone: bool = True,
        log: PaceLog | None = None,
        presence: Presence | None = None,
        live: float = 0.0,
    ) -> Pacer:
        """The pacer these options describe; ``share``: this run's share of the key's rate;
        ``alone``: False for one of several runs of one job at once; ``log``: told what it does
        (``engine.timeline.Timeline``); ``presence``: the run on the key's budget; ``live``: a live
        run's part of the key ahead of the batch runs (the gateway's); see ``Pacer``."""
        return Pacer(
            self.rpm,
            limiter=self.limiter,
            budget=self.budget,
            max_in_flight=self.concurrency,
            on_pace_change=on_pace_change,
            share=share,
            alone=alone,
            log=log,
            record=self.record,
            auto=self.auto,
            presence=presence,
            live=live,
        )

    def first_alone(self, mode: int) -> bool:
        """Does the run's first request go alone? Yes, unless the key's record proves the key."""
        return self.record is None or self.record.proven(mode) is None


def _budget(budget: Any) -> Budget | None:
    if budget is not None and not isinstance(budget, Budget):
        raise InvalidParameterError(
            f"invalid budget {budget!r}: open one with batchsum.pacing.budgets.budget.open_budget"
        )
    return budget
