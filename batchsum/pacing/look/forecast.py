"""What a key can do now (``key_now`` -> ``KeyNow``: the rate the run sends at on it, its share of the
key's limit; its quotas and what each leaves until its reset, whether it is out of the run and until
when), and what a run of N requests does on its keys (``project``): the run's decision when every key
is out (``first_back``) and a dry run's projection are made by the same functions, so the dry run
says what the run then does.

Invariant: a key out (a quota spent, or nothing left in one) adds nothing to the rate until it is
back; when every key is out, the run waits for the first back only when that is within ``max_wait``
from the moment they are all out, else it stops. Times are on one clock per call: Unix times in a
dry run, the pacer's clock in a run (only differences between them are used, but a quota in UTC
calendar periods is renewed by its period's name, so ``project`` takes Unix times).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ...service.key_plans import period_window

__all__ = ["QuotaLeft", "KeyNow", "Wait", "Projection", "key_now", "first_back", "project"]

_EPSILON = 1e-9  # requests: what is left of a quota after float steps that spent it exactly


@dataclass(frozen=True)
class QuotaLeft:
    """One quota of a key as it stands: ``left`` requests until ``resets``; then ``limit`` each
    period (``period``: a UTC calendar period's name, ``hour``, ``day`` or ``month``, or a length in
    seconds; None with ``limit`` None: not known, and nothing holds the key after its reset)."""

    name: str
    left: int
    resets: float
    limit: int | None = None
    period: str | float | None = None

    def renewed(self) -> QuotaLeft | None:
        """The quota's next period, from its reset (None: not known)."""
        if self.limit is None or self.period is None:
            return None
        if isinstance(self.period, str):
            end = period_window(self.period, self.resets)[2]
        else:
            end = self.resets + self.period
        return replace(self, left=self.limit, resets=end)


@dataclass(frozen=True)
class KeyNow:
    """What a key can do now: the run sends on it at ``rate`` requests a minute (its share of the
    key's limit; None: not known yet, the limit searched for under ``auto``; 0: unpaced) within its
    ``quotas``; ``out_until``: out of the run until then (``math.inf``: refused for good; None: it
    sends now), ``why`` in words (the quota spent, or the service's refusal)."""

    name: str
    rate: float | None
    quotas: tuple[QuotaLeft, ...] = ()
    out_until: float | None = None
    why: str = ""

    @property
    def refused(self) -> bool:
        return self.out_until == math.inf

    def out(self, at: float) -> bool:
        return self.out_until is not None and at < self.out_until


def key_now(
    name: str,
    limit: float | None,
    at: float,
    *,
    share: float,
    quotas: Sequence[QuotaLeft] = (),
    out: tuple[float, str] | None = None,
    refusal: str | None = None,
) -> KeyNow:
    """What a key can do at ``at`` for a run: refused for good (``refusal``: the service's words); out
    until a quota spent comes back (``out``: until when, and which quota), or until the latest reset
    of its ``quotas`` with nothing left; else it sends at its ``limit`` (requests a minute; None: not
    known) times the run's ``share`` of the key (``--share``: the budget spaces the run's own starts
    that much further apart). The run reads its keys by it, and so do a dry run and DuckDB's estimate
    (from the key's record and its budget's counts)."""
    quotas = tuple(quotas)
    rate = limit * share if limit is not None else None
    if refusal is not None:
        return KeyNow(name, rate, quotas, math.inf, refusal)
    until, why = (out[0], out[1]) if out is not None and out[0] > at else (None, "")
    for quota in quotas:
        if quota.left <= 0 and quota.resets > at and (until is None or quota.resets > until):
            until, why = quota.resets, quota.name
    return KeyNow(name, rate, quotas, until, why)


def first_back(keys: Sequence[KeyNow], at: float, max_wait: float) -> KeyNow | None:
    """Every key is out at ``at``: the key the run waits for (the first back, when it is back within
    ``max_wait``), or None when the run stops: no key comes back (each refused), or the first back is
    further than ``max_wait``."""
    back = [key for key in keys if key.out_until is not None and not key.refused]
    if not back:
        return None
    first = min(back, key=lambda key: key.out_until or 0.0)
    assert first.out_until is not None
    return first if first.out_until - at <= max_wait else None


@dataclass(frozen=True)
class Wait:
    """A wait of a run with every key out: from ``start`` until ``until``, for ``why`` (the first
    key back: its quota's reset), after ``sent`` requests."""

    start: float
    until: float
    why: str
    sent: int


@dataclass(frozen=True)
class Projection:
    """What a run of ``requests`` does on its keys (``project``): it sends ``sent`` (all of them,
    unless it stops) at ``rate`` requests a minute to begin with (the keys that send first; None: not
    known), in ``seconds`` from the start to its last start, ``waits`` included (None: a rate not
    known); a stop at ``stop_at`` when every key is out and none is back within ``max_wait``:
    ``back`` the first reset then (None: every key refused), for ``why``."""

    requests: int
    sent: int
    rate: float | None
    seconds: float | None
    waits: tuple[Wait, ...] = ()
    stop_at: float | None = None
    back: float | None = None
    why: str = ""

    @property
    def stops(self) -> bool:
        return self.stop_at is not None

    @property
    def waited(self) -> float:
        return sum(wait.until - wait.start for wait in self.waits)


@dataclass
class _Lane:
    """One key as ``project`` moves it on: what its quotas leave, when it is out until."""

    key: KeyNow
    quotas: list[QuotaLeft]
    out_until: float | None
    why: str
    left: list[float] = field(default_factory=list)  # what each quota leaves, spent in fractions
    started: bool = False

    @classmethod
    def of(cls, key: KeyNow) -> _Lane:
        return cls(key, list(key.quotas), key.out_until, key.why, [float(q.left) for q in key.quotas])

    def now(self) -> KeyNow:
        return KeyNow(self.key.name, self.key.rate, (), self.out_until, self.why)

    def out(self, at: float) -> bool:
        return self.out_until is not None and at < self.out_until

    def back(self, at: float) -> None:
        """The key at ``at``: back when its time came, and each quota past its reset renewed (or
        dropped when its next period is not known)."""
        if self.out_until is not None and at >= self.out_until:
            self.out_until, self.why = None, ""
        quotas, left = [], []
        for quota, room in zip(self.quotas, self.left):
            renewed: QuotaLeft | None = quota
            while renewed is not None and renewed.resets <= at:
                renewed = renewed.renewed()
                room = float(renewed.left) if renewed is not None else room
            if renewed is not None:
                quotas.append(renewed)
                left.append(room)
        self.quotas, self.left = quotas, left

    def next_reset(self) -> float:
        return min((quota.resets for quota in self.quotas), default=math.inf)

    def room(self) -> float:
        return min(self.left, default=math.inf)

    def spend(self, count: float) -> None:
        """``count`` sent: each quota counts them; one with nothing left takes the key out until
        its reset (the latest of those spent)."""
        self.left = [room - count for room in self.left]
        for quota, room in zip(self.quotas, self.left):
            if room <= _EPSILON and (self.out_until is None or quota.resets > self.out_until):
                self.out_until, self.why = quota.resets, quota.name


def project(keys: Sequence[KeyNow], requests: int, at: float, max_wait: float) -> Projection:
    """What a run of ``requests`` does on ``keys`` from ``at``: each key's first request at once
    (its lone first), then at its rate, the keys' rates summed while they send; a key whose quota
    has nothing left is out until its reset; every key out, the run waits for the first back within
    ``max_wait`` (``first_back``, as the run decides) or stops there. Requests are spread as the run
    spreads them, by rate (a fluid count: the numbers are whole where a quota decides)."""
    return _Projector(keys, requests, at).run(max_wait)


class _Projector:
    """``project``'s state: the keys as they move on (``lanes``), the time ``t``, the requests left
    and sent, the waits, the rate the keys that send first send at (``rate``), and whether the time
    is known (False once a key whose rate is not known sent)."""

    def __init__(self, keys: Sequence[KeyNow], requests: int, at: float) -> None:
        self.lanes = [_Lane.of(key) for key in keys]
        self.requests, self.at, self.t = requests, at, at
        self.left, self.sent = float(requests), 0.0
        self.waits: list[Wait] = []
        self.rate: float | None = None
        self.rated = False  # ``rate`` is set: the first keys to send have sent
        self.known = True

    def run(self, max_wait: float) -> Projection:
        while self.left > _EPSILON:
            for lane in self.lanes:
                lane.back(self.t)
            sending = [lane for lane in self.lanes if not lane.out(self.t)]
            if not sending:
                waiting = first_back([lane.now() for lane in self.lanes], self.t, max_wait)
                if waiting is None:
                    return self._stopped()
                assert waiting.out_until is not None
                self.waits.append(Wait(self.t, waiting.out_until, waiting.why, round(self.sent)))
                self.t = waiting.out_until
                continue
            if not self.rated:
                rates = [lane.key.rate for lane in sending]
                self.rate = None if any(r is None for r in rates) else sum(r or 0.0 for r in rates)
                self.rated = True
            fresh = [lane for lane in sending if not lane.started]
            fast = [lane for lane in sending if not lane.key.rate]  # not known, or unpaced: no time of their own
            if fresh:  # each key's first request goes at once (alone: the others wait for its answer)
                for lane in fresh:
                    lane.started = True
                    self._send(lane, min(1.0, self.left))
            elif fast:
                self.known = self.known and all(lane.key.rate == 0 for lane in fast)
                for lane in fast:
                    self._send(lane, min(self.left, lane.room()))
            else:
                self._step(sending)
        return Projection(self.requests, round(self.sent), self.rate, self._seconds(), tuple(self.waits))

    def _send(self, lane: _Lane, count: float) -> None:
        lane.spend(count)
        self.left, self.sent = self.left - count, self.sent + count

    def _step(self, sending: list[_Lane]) -> None:
        """The keys sending at their rates until the next thing that changes them: the job done, a
        quota spent, a key back, a quota renewed."""
        speeds = [(lane, (lane.key.rate or 0.0) / 60) for lane in sending]
        step = self.left / sum(speed for _, speed in speeds)
        for lane, speed in speeds:
            step = min(step, max(0.0, lane.room()) / speed)
        later = [lane.out_until for lane in self.lanes if lane.out_until is not None and lane.out_until > self.t]
        later += [lane.next_reset() for lane in sending]
        step = min([step, *(until - self.t for until in later if until != math.inf)])
        for lane, speed in speeds:
            self._send(lane, min(speed * step, self.left))
        self.t += step

    def _seconds(self) -> float | None:
        return self.t - self.at if self.known else None

    def _stopped(self) -> Projection:
        """Every key out, none back within ``max_wait``: the run stops here."""
        backs = [lane for lane in self.lanes if lane.out_until is not None and lane.out_until != math.inf]
        first = min(backs, key=lambda lane: lane.out_until or 0.0, default=None)
        back, why = (first.out_until, first.why) if first is not None else (None, "")
        sent = round(self.sent)
        return Projection(self.requests, sent, self.rate, self._seconds(), tuple(self.waits), self.t, back, why)
