"""A run's live counts (``BatchStats``): rows by status, requests and their attempts, what the service
billed and what used its rate (``charge``, the one rule), and long texts' extra work (``LongWork``);
read by progress bars, the one-line account and the run report."""

from __future__ import annotations

import bisect
import math
import operator
import random
import time
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..data.results import OK, SKIPPED, RowResult
from ..service.errors import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    AuthenticationError,
    RateLimitError,
)
from .long_texts import estimate_requests
from .timeline import Timeline

if TYPE_CHECKING:
    from ..pacing import Pacer, PacerState
    from .lanes import Pacers

__all__ = ["BatchStats", "LongWork", "Waits", "Telemetry", "Charge", "charge", "WAITS_SECONDS"]

WAITS_SECONDS = 60.0  # the waits a door's percentiles are of: those of the trailing minute
WAITS_KEPT = 100_000  # past this many, the report's waits are a uniform sample of them (its memory bounded)

_STATUS = operator.attrgetter("status")


class Charge(NamedTuple):
    """What one attempt cost: ``paid``, billed by the service or maybe billed (the report's
    ``requests.paid``, what ``max_requests`` caps and a configured quota counts), and ``used_rate``,
    counted against the service's rate (the report's ``requests.used_rate`` and utilization; the
    pace spaces every start whatever it cost)."""

    paid: bool
    used_rate: bool


_BILLED, _USED, _FREE = Charge(True, True), Charge(False, True), Charge(False, False)


def charge(error: BaseException | None) -> Charge:
    """What an attempt that ended with ``error`` (None: answered) cost, by one rule:

    - an answer (200) is billed, and so is a 200 whose body could not be read (``bad_response``);
    - a 429 (the service's "later") and a 401 for a wrong key cost nothing;
    - any other answer the service gave that is not a summary is not billed but used the rate: a 401
      for the plan (an expired plan, or a mode it refuses), a 422, a 5xx (the service's failure), any
      other status;
    - a timeout, a connection lost once made, a stop while on the wire: maybe billed (the request may
      have reached the service, and no answer will say it did not), so they count as paid: a cap or a
      quota is never overspent; and they used the rate;
    - a connection never made (refused, or none within the timeout) reached nothing: it costs nothing."""
    if error is None or isinstance(error, APIResponseValidationError):
        return _BILLED
    if isinstance(error, (RateLimitError, AuthenticationError)):
        return _FREE
    if isinstance(error, APIStatusError):
        return _USED
    if isinstance(error, APIConnectionError) and not error.reached:
        return _FREE
    return _BILLED


class Telemetry(Protocol):
    """What the counts tell a run's metrics as they change (``run.telemetry.Metrics``)."""

    def attempt_started(self) -> None: ...

    def attempt_ended(self, outcome: str, latency: float | None, paid: bool) -> None: ...

    def row_done(self, status: str, count: int = 1) -> None: ...


@dataclass
class LongWork:
    """Long texts' extra requests: planned and done (the bar counts them), and what the skipped ones
    would cost split."""

    planned: int = 0
    done: int = 0
    skipped_parts: int = 0
    skipped_reduce: int = 0

    def skip(self, words: int) -> None:
        """A text over the limit skipped (``long_texts="skip"``): what splitting it would cost."""
        parts, reduce = estimate_requests(words)
        self.skipped_parts += parts
        self.skipped_reduce += reduce

    def finish(self, result: RowResult, parts: int, answers: Sequence[object]) -> RowResult:
        """A long row finished with ``result`` after ``answers`` (its requests): the plan corrected."""
        extra = len(answers) - 1 if result.status == OK else len(answers)
        self.planned += extra - parts
        self.done += extra
        return result._replace(requests=len(answers))

    def skipped_cost(self, rows: int) -> str:
        """What splitting the ``rows`` skipped as too long would cost, said after the account ("": none)."""
        if not self.skipped_parts:
            return ""
        return (
            f". The {rows} too_long rows would take {self.skipped_parts} part requests and at most "
            f"{self.skipped_reduce} reduce requests with --long-texts split (long_texts='split')"
        )


@dataclass
class Waits:
    """A door that answers requests as they come (``batchsum gateway``): how many wait for their turn
    now (``waiting``: in the door and not on the wire), how long the requests of the trailing minute waited for it (their start on the
    key, or their answer from the store), and what was answered otherwise: ``late`` (a 429 at the
    request's deadline), ``unavailable`` (a 503: the key's budget out of reach). A batch run has none."""

    open: int = 0  # requests in the door, not yet answered
    wire: Callable[[], int] = lambda: 0  # of its requests, those on the wire now
    answered: int = 0
    late: int = 0
    unavailable: int = 0
    _at: list[float] = field(default_factory=list)  # when each recent wait ended (monotonic), in order
    _seconds: list[float] = field(default_factory=list)
    _all: array[float] = field(default_factory=lambda: array("d"))  # the waits the report's percentiles are of
    _count: int = 0
    _draw: random.Random = field(default_factory=lambda: random.Random(0))

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn now: in the door, not on the wire."""
        return max(0, self.open - self.wire())

    def waited(self, seconds: float, now: float | None = None) -> None:
        """A request's wait for its turn ended after ``seconds``."""
        now = time.monotonic() if now is None else now
        self._at.append(now)
        self._seconds.append(seconds)
        self._count += 1
        if len(self._all) < WAITS_KEPT:
            self._all.append(seconds)
        elif (slot := self._draw.randrange(self._count)) < WAITS_KEPT:  # a uniform sample of them all
            self._all[slot] = seconds
        if self._at[0] < now - 2 * WAITS_SECONDS:
            gone = bisect.bisect_left(self._at, now - WAITS_SECONDS)
            del self._at[:gone], self._seconds[:gone]

    def percentiles(self, now: float | None = None) -> tuple[float | None, float | None]:
        """The p50 and p95 of the trailing minute's waits, in seconds (None: no request in it)."""
        now = time.monotonic() if now is None else now
        recent = sorted(self._seconds[bisect.bisect_left(self._at, now - WAITS_SECONDS) :])
        if not recent:
            return None, None
        return recent[math.ceil(0.5 * len(recent)) - 1], recent[math.ceil(0.95 * len(recent)) - 1]

    @property
    def every(self) -> array[float]:
        """The waits since the door opened (every one, or past ``WAITS_KEPT`` a uniform sample of
        them): the run report's percentiles."""
        return self._all

    @property
    def count(self) -> int:
        """Requests whose wait ended since the door opened."""
        return self._count


def _by(counter: Counter[str]) -> str:
    return " (" + ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) + ")" if counter else ""


@dataclass
class BatchStats:
    """Live counts of a batch, read by progress bars and the final account."""

    total: int | None = None
    yielded: int = 0  # rows handed out, in input order (what an output holds so far)
    ok: int = 0
    sent: int = 0  # requests that went to the service (each may take several attempts)
    attempts: int = 0
    reused: int = 0  # rows answered from the store or by an identical request of this run
    from_store: int = 0  # of those, rows the answer store shared beyond the run answered (other jobs' answers)
    skipped_by_reason: Counter[str] = field(default_factory=Counter)
    failed_by_code: Counter[str] = field(default_factory=Counter)
    sent_by_kind: Counter[str] = field(default_factory=Counter)  # "row", "part", "reduce"
    long_work: LongWork = field(default_factory=lambda: LongWork())
    started: float = field(default_factory=time.monotonic)
    pacer: Pacer | Pacers | None = None  # the run's pacer; over several keys, theirs as one
    timeline: Timeline | None = None  # told by the pacer (``PaceLog``) and by the counts here
    first_request: str | None = None  # whether the run's first request went alone, and why
    requests: int = 0  # attempts that went to the service, 429s and retries included
    paid: int = 0  # attempts the service billed, or may have (``charge``)
    used_rate: int = 0  # attempts the service counts against its rate (``charge``)
    outcomes: Counter[str] = field(default_factory=Counter)  # attempts by outcome: ok, rate_limited, error codes
    latencies: array[float] = field(default_factory=lambda: array("d"))  # of answered attempts, seconds
    telemetry: Telemetry | None = None
    waiting: str | None = None  # every key out: what the run waits for ("waits for the daily quota ...")
    waits: Waits | None = None  # a door answering requests as they come (the gateway): its queue and waits

    @property
    def skipped(self) -> int:
        return self.skipped_by_reason.total()

    @property
    def failed(self) -> int:
        return self.failed_by_code.total()

    @property
    def done(self) -> int:
        """Rows whose result is known (counted as they arrive, in any order)."""
        return self.ok + self.skipped + self.failed

    def attempt_started(self, on_wire: int) -> None:
        self.requests += 1
        if self.pacer is not None and self.timeline is not None:
            self.timeline.in_flight(self.pacer.now(), on_wire)
        if self.telemetry is not None:
            self.telemetry.attempt_started()

    def attempt_ended(self, outcome: str, latency: float | None, on_wire: int, cost: Charge = _BILLED) -> None:
        self.outcomes[outcome] += 1
        self.paid += cost.paid
        self.used_rate += cost.used_rate
        if latency is not None:
            self.latencies.append(latency)
        if self.pacer is not None and self.timeline is not None:
            self.timeline.in_flight(self.pacer.now(), on_wire)
        if self.telemetry is not None:
            self.telemetry.attempt_ended(outcome, latency, cost.paid)

    @property
    def work_total(self) -> int | None:
        """What the bar counts to: one per row, and a long row's extra requests (planned: its parts
        and one reduce; corrected when it is done)."""
        return None if self.total is None else self.total + self.long_work.planned

    @property
    def work_done(self) -> int:
        return self.done + self.long_work.done

    def long_skipped(self, words: int) -> None:
        self.long_work.skip(words)

    def long_planned(self, parts: int) -> None:
        self.long_work.planned += parts  # parts + one reduce, less the row itself

    def long_done(self, result: RowResult, parts: int, answers: Sequence[object]) -> RowResult:
        return self.long_work.finish(result, parts, answers)

    @property
    def rate_limited(self) -> int:
        return self.pacer.rate_limited if self.pacer else 0

    @property
    def pace(self) -> float:
        return self.pacer.pace if self.pacer else 0.0

    def pacer_state(self) -> PacerState | None:
        """The pacer's state now (pace, pause and why, in flight), for progress lines."""
        try:
            return self.pacer.state() if self.pacer else None
        except RuntimeError:  # no running loop (read from another thread after the run)
            return None

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def record(self) -> dict[str, Any]:
        """The run's account and timeline as plain data (``out.attrs["batchsum"]``, ``plot_run``)."""
        timeline = self.timeline.to_dict() if self.timeline is not None else None
        if timeline is not None:
            timeline["total"] = self.total
        return {
            "account": self.account(),
            "rows": self.done,
            "ok": self.ok,
            "skipped": self.skipped,
            "failed": self.failed,
            "sent": self.sent,
            "sent_by_kind": dict(self.sent_by_kind),
            "reused": self.reused,
            "from_store": self.from_store,
            "rate_limited": self.rate_limited,
            "skipped_by_reason": dict(self.skipped_by_reason),
            "failed_by_code": dict(self.failed_by_code),
            "seconds": round(self.elapsed, 3),
            "pace_changes": [str(change) for change in self.pacer.changes] if self.pacer is not None else [],
            "timeline": timeline,
        }

    def count(self, result: RowResult) -> None:
        self.count_many((result,))

    def count_many(self, results: Sequence[RowResult]) -> None:
        """``count`` for rows whose results came together (a block the store answered)."""
        if self.pacer is not None and self.timeline is not None:
            self.timeline.done(self.pacer.now(), len(results))
        ok = list(map(_STATUS, results)).count(OK)
        for result in results if ok < len(results) else ():
            if result.status != OK:  # skipped, counted by reason, or failed, by code
                by = self.skipped_by_reason if result.status == SKIPPED else self.failed_by_code
                by[result.error or "?"] += 1
                if self.telemetry is not None:
                    self.telemetry.row_done(result.status)
        self.ok += ok
        if ok and self.telemetry is not None:
            self.telemetry.row_done(OK, ok)

    def account(self) -> str:
        """One line: rows, sent, reused, skipped by reason, failed by code, 429s, paid, wall time."""
        parts, reduces = self.sent_by_kind["part"], self.sent_by_kind["reduce"]
        long = f" ({parts} long-text parts, {reduces} reduces)" if parts or reduces else ""
        store = f" ({self.from_store} from the store)" if self.from_store else ""
        return (
            f"{self.done} rows: {self.ok} ok, {self.skipped} skipped{_by(self.skipped_by_reason)}, "
            f"{self.failed} failed{_by(self.failed_by_code)}; {self.sent} sent{long}, {self.reused} reused{store}, "
            f"{self.rate_limited} 429s, {self.paid} paid, {self.elapsed:.1f}s"
        ) + self.long_work.skipped_cost(self.skipped_by_reason["too_long"])
