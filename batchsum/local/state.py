"""What the local service remembers: keys and their plans, per-key limits (a sliding window by
default; a fixed window from the key's first request, or a token bucket that starts full, behind
``limit_kind``), faults to inject, and counts of what it was asked (so tests and benchmarks can check
what was sent)."""

from __future__ import annotations

import enum
import hashlib
import json
import math
import random
import secrets
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "Plan",
    "Account",
    "ServiceState",
    "Faults",
    "FAULT_KINDS",
    "LIMIT_KINDS",
    "ROOM_HEADERS",
    "SlidingWindow",
    "FixedWindow",
    "TokenBucket",
    "ClockWindow",
    "parse_key_spec",
]


class Plan(str, enum.Enum):
    """premium: everything; basic: mode 1 only; expired: nothing."""

    PREMIUM = "premium"
    BASIC = "basic"
    EXPIRED = "expired"


# "429": a rate-limit answer with Retry-After; "500": shape-A server error; "502": an HTML page
# from a "proxy"; "drop": the connection is cut mid-answer; "hang": no answer for `hang_seconds`;
# "garbled": a 200 whose JSON is cut short; "422": a refusal the client could not foresee (as when the
# live service counts words differently), to exercise permanent failures.
FAULT_KINDS = ("429", "500", "502", "drop", "hang", "garbled", "422")


def new_key() -> str:
    """A random key that never starts with '-' (a command line would read it as an option)."""
    return "bs-" + secrets.token_urlsafe(24)


def parse_key_spec(spec: str) -> tuple[str, Plan]:
    """``KEY`` or ``KEY:PLAN`` (premium, basic, expired) -> (key, plan)."""
    key, _, plan = spec.partition(":")
    if not key or key.startswith("-") or not all("!" <= c <= "~" for c in key):
        raise ValueError(f"invalid key {spec!r}: use KEY or KEY:PLAN, printable ASCII not starting with '-'")
    try:
        return key, Plan(plan or "premium")
    except ValueError:
        raise ValueError(f"invalid plan {plan!r} in {spec!r}: use premium, basic or expired") from None


@dataclass
class Faults:
    """Faults to inject. ``script`` is consumed first, one fault (or "ok") per request; then each
    kind in ``rates`` strikes with its probability (seeded, so runs repeat).

    What a test acts on after N answers must find the run still going, however late the machine
    lets the test run: ``latency_after=N`` answers the first N requests at once and gives the rest
    their latency (the run cannot end sooner than its remaining rows take), ``hold_after=N`` holds
    every request after the first N unanswered until ``release()`` is called or the service's faults
    are replaced (the run cannot end until the test lets it). Requests are counted as they arrive."""

    latency: float = 0.0
    latency_spread: float = 0.0  # each answer takes latency + up to this much more, uniformly (seeded)
    rates: dict[str, float] = field(default_factory=dict)
    script: deque[str] = field(default_factory=deque)
    retry_after: float | None = 1.0  # seconds on injected 429s; None sends no Retry-After
    hang_seconds: float = 30.0
    seed: int = 0
    latency_after: int = 0  # the first this many requests answer at once; the latency is the rest's
    hold_after: int | None = None  # requests after this many wait for release() (or new faults)

    def __post_init__(self) -> None:
        self.script = deque(self.script)
        for name in ("latency", "latency_spread", "hang_seconds"):
            if not 0 <= getattr(self, name) <= 600:
                raise ValueError(f"invalid {name} {getattr(self, name)!r}: use 0 to 600 seconds")
        for name in ("latency_after", "hold_after"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"invalid {name} {value!r}: use a whole number of requests, 0 or more")
        if self.retry_after is not None and not 0 <= self.retry_after <= 3600:
            raise ValueError(f"invalid retry_after {self.retry_after!r}: use 0 to 3600 seconds, or null")
        for kind, rate in self.rates.items():
            if not 0 <= rate <= 1:
                raise ValueError(f"invalid rate {rate!r} for {kind!r}: use 0 to 1")
        for kind in list(self.rates) + list(self.script):
            if kind not in FAULT_KINDS and kind != "ok":
                raise ValueError(f"unknown fault {kind!r}: use one of {', '.join(FAULT_KINDS)}")
        self._random = random.Random(self.seed)
        self._latency_random = random.Random(self.seed + 1)
        self._arrived = 0
        self._released = threading.Event()

    def arrive(self) -> int:
        """A request arrived: its number (1 for the first)."""
        self._arrived += 1
        return self._arrived

    def delay(self, number: int | None = None) -> float:
        """Seconds the answer to request ``number`` takes: ``latency``, plus up to ``latency_spread``
        at random; none for the first ``latency_after``."""
        if number is not None and number <= self.latency_after:
            return 0.0
        if not self.latency_spread:
            return self.latency
        return self.latency + self.latency_spread * self._latency_random.random()

    def holds(self, number: int) -> bool:
        """Is request ``number`` held until ``release()``?"""
        return self.hold_after is not None and number > self.hold_after and not self._released.is_set()

    def release(self) -> None:
        """Let the held requests (and every later one) go on. Safe from any thread."""
        self._released.set()

    @property
    def released(self) -> bool:
        return self._released.is_set()

    def next(self) -> str | None:
        if self.script:
            kind = self.script.popleft()
            return None if kind == "ok" else kind
        for kind in FAULT_KINDS:
            rate = self.rates.get(kind, 0.0)
            if rate and self._random.random() < rate:
                return kind
        return None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Faults:
        return cls(
            latency=float(data.get("latency", 0.0)),
            latency_spread=float(data.get("latency_spread", 0.0)),
            rates={str(k): float(v) for k, v in dict(data.get("rates", {})).items()},
            script=deque(str(k) for k in data.get("script", [])),
            retry_after=data.get("retry_after", 1.0),
            hang_seconds=float(data.get("hang_seconds", 30.0)),
            seed=int(data.get("seed", 0)),
            latency_after=int(data.get("latency_after", 0)),
            hold_after=None if data.get("hold_after") is None else int(data["hold_after"]),
        )


def fingerprint(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class SlidingWindow:
    """At most ``limit`` accepted requests in any ``window`` seconds (a log of accept times)."""

    __slots__ = ("limit", "window", "_times")

    def __init__(self, limit: int, window: float = 60.0) -> None:
        self.limit = limit
        self.window = window
        self._times: deque[float] = deque()

    def _forget(self, now: float) -> None:
        while self._times and self._times[0] <= now - self.window:
            self._times.popleft()

    def admit(self, now: float) -> float | None:
        """Record the request and return None, or return the seconds until it would be admitted."""
        self._forget(now)
        if len(self._times) < self.limit:
            self._times.append(now)
            return None
        return self._times[0] + self.window - now

    def room(self, now: float) -> tuple[int, float]:
        """(requests it would admit now, seconds until the oldest one counted leaves the window)."""
        self._forget(now)
        return self.limit - len(self._times), (self._times[0] + self.window - now) if self._times else self.window


class FixedWindow:
    """At most ``limit`` accepted requests per window of ``window`` seconds, the first opening at the
    first request (a counter that expires ``window`` seconds after its first increment, as a Redis
    ``INCR`` + ``EXPIRE`` limiter does); the next opens at the first request after it ends. Only
    accepted requests count."""

    __slots__ = ("limit", "window", "_opened", "_count")

    def __init__(self, limit: int, window: float = 60.0) -> None:
        self.limit = limit
        self.window = window
        self._opened: float | None = None
        self._count = 0

    def admit(self, now: float) -> float | None:
        if self._opened is None or now >= self._opened + self.window:
            self._opened, self._count = now, 0
        if self._count < self.limit:
            self._count += 1
            return None
        return self._opened + self.window - now

    def room(self, now: float) -> tuple[int, float]:
        """(requests it would admit now, seconds until the window resets)."""
        if self._opened is None or now >= self._opened + self.window:
            return self.limit, self.window
        return self.limit - self._count, self._opened + self.window - now


class TokenBucket:
    """A bucket of ``limit`` tokens that starts full and refills at ``limit`` per ``window`` seconds;
    each accepted request takes one."""

    __slots__ = ("limit", "window", "_tokens", "_at")

    def __init__(self, limit: int, window: float = 60.0) -> None:
        self.limit = limit
        self.window = window
        self._tokens = float(limit)
        self._at: float | None = None

    def _refill(self, now: float) -> None:
        if self._at is not None:
            self._tokens = min(float(self.limit), self._tokens + (now - self._at) * self.limit / self.window)
        self._at = now

    def admit(self, now: float) -> float | None:
        self._refill(now)
        if self._tokens >= 1:
            self._tokens -= 1
            return None
        return (1 - self._tokens) * self.window / self.limit

    def room(self, now: float) -> tuple[int, float]:
        """(requests it would admit now, seconds until it is full again)."""
        self._refill(now)
        return math.floor(self._tokens), (self.limit - self._tokens) * self.window / self.limit


class ClockWindow:
    """At most ``limit`` accepted requests per fixed window of ``window`` seconds aligned to the
    clock (windows begin at multiples of ``window``): a minute on the wall clock, or a minute counted
    in 10 s or 1 s windows (a quantized limit). The strictest judge of an even pace: a burst of two
    starts closer than the plan's interval at a window's edge is refused."""

    __slots__ = ("limit", "window", "_current", "_count")

    def __init__(self, limit: int, window: float = 60.0) -> None:
        self.limit = limit
        self.window = window
        self._current: int | None = None
        self._count = 0

    def admit(self, now: float) -> float | None:
        current = math.floor(now / self.window)
        if current != self._current:
            self._current, self._count = current, 0
        if self._count < self.limit:
            self._count += 1
            return None
        return (current + 1) * self.window - now

    def room(self, now: float) -> tuple[int, float]:
        """(requests it would admit now, seconds until the window ends)."""
        current = math.floor(now / self.window)
        used = self._count if current == self._current else 0
        return self.limit - used, (current + 1) * self.window - now


Limit = SlidingWindow | FixedWindow | TokenBucket | ClockWindow


def _per(seconds: float) -> Callable[[int, float], ClockWindow]:
    """A plan of ``rpm`` per ``window`` counted in clock-aligned windows of ``seconds`` (its share)."""
    return lambda rpm, window: ClockWindow(max(1, round(rpm * seconds / window)), seconds)


# How the per-key limit counts, by name: each made from (rpm, window seconds).
LIMIT_KINDS: dict[str, Callable[[int, float], Limit]] = {
    "sliding": SlidingWindow,
    "fixed": FixedWindow,
    "bucket": TokenBucket,
    "clock": ClockWindow,
    "clock-10s": _per(10.0),
    "clock-1s": _per(1.0),
}
# Which headers state the room left (None: none, as the live service): IETF draft names, or the
# X- names most services use.
ROOM_HEADERS = ("ratelimit", "x-ratelimit")


@dataclass
class Account:
    """What one key may do beyond its plan: its own per-minute limit (``rpm``; None: the service's),
    a plan that expires after ``expires_after`` admitted requests (then 401 "you are not premium for
    this request"), and a ``quota`` of admitted requests per ``quota_window`` seconds (a window opened
    by the key's first request), refused once spent with a 429 whose Retry-After runs to the window's
    end (``state_quota``: every answer states it in the list form, ``RateLimit-Limit: Q, RPM;w=60,
    Q;w=W`` with its ``-Remaining`` and ``-Reset``). Refusals of the account are answered at once (the
    service does no work for them)."""

    rpm: int | None = None
    expires_after: int | None = None
    quota: int | None = None
    quota_window: float = 86_400.0
    state_quota: bool = False
    admitted: int = 0
    quota_used: int = 0
    quota_opened: float | None = None

    def quota_room(self, now: float) -> tuple[int, float]:
        """(requests left in the quota, seconds until its window ends)."""
        assert self.quota is not None
        if self.quota_opened is None or now >= self.quota_opened + self.quota_window:
            return self.quota, self.quota_window
        return self.quota - self.quota_used, self.quota_opened + self.quota_window - now

    def refusal(self, now: float) -> tuple[int, dict[str, str]] | None:
        """(status, headers) of the account's refusal of a request arriving ``now``, or None."""
        if self.expires_after is not None and self.admitted >= self.expires_after:
            return 401, {}
        if self.quota is not None:
            left, reset = self.quota_room(now)
            if left <= 0:
                return 429, {"Retry-After": str(max(1, math.ceil(reset))), **self.headers(now, 0)}
        return None

    def admit(self, now: float) -> None:
        self.admitted += 1
        if self.quota is not None:
            if self.quota_opened is None or now >= self.quota_opened + self.quota_window:
                self.quota_opened, self.quota_used = now, 0
            self.quota_used += 1

    def headers(self, now: float, rpm: int) -> dict[str, str]:
        if not self.state_quota or self.quota is None:
            return {}
        left, reset = self.quota_room(now)
        window = f"{rpm};w=60, " if rpm else ""
        return {
            "RateLimit-Limit": f"{self.quota}, {window}{self.quota};w={self.quota_window:g}",
            "RateLimit-Remaining": str(max(0, left)),
            "RateLimit-Reset": str(max(1, math.ceil(reset - 1e-6))),
        }


class ServiceState:
    """Keys, plans, limits, faults and counters; shared by the routes, safe across threads."""

    def __init__(
        self,
        keys: Iterable[str] | dict[str, Plan] | None = None,
        rpm: int = 0,
        faults: Faults | None = None,
        clock: Callable[[], float] = time.monotonic,
        window: float = 60.0,
        admin_key: str | None = None,
        limit_kind: str = "sliding",
        room_headers: str | None = None,
        accounts: dict[str, Account] | None = None,
    ) -> None:
        if limit_kind not in LIMIT_KINDS:
            raise ValueError(f"invalid limit_kind {limit_kind!r}: use {', '.join(LIMIT_KINDS)}")
        if room_headers is not None and room_headers not in ROOM_HEADERS:
            raise ValueError(f"invalid room_headers {room_headers!r}: use {', '.join(ROOM_HEADERS)}, or None")
        if keys is None:
            keys = {new_key(): Plan.PREMIUM}
        elif not isinstance(keys, dict):
            keys = dict(parse_key_spec(spec) for spec in keys)
        self.admin_key = admin_key  # the test controls (/_local/*) need it; None: they are off
        self._lock = threading.Lock()
        self._made = dict(keys), rpm, window, limit_kind, room_headers, clock, replace(faults or Faults())
        self._made_accounts = {key: replace(account) for key, account in (accounts or {}).items()}  # copies
        self.reset()  # then the faults and accounts given are served as they are (their maker may act on them):
        self.faults, self.accounts = faults or Faults(), dict(accounts or {})

    def reset(self) -> None:
        """Back as it was made: keys, plans, limit, clock, faults, accounts, counts; each key's window gone."""
        plans, rpm, window, limit_kind, room_headers, clock, faults = self._made
        self.plans: dict[str, Plan] = dict(plans)
        self.rpm, self.window = rpm, window  # requests allowed per key in any `window` seconds (0 = no limit)
        self.limit_kind = limit_kind  # how the per-key limit counts: sliding, fixed, bucket
        self.room_headers = room_headers  # state the room left in every answer's headers (None: never)
        self.clock = clock
        self._windows: dict[str, Limit] = {}  # each key's, made at its first request with the limit then
        self.accounts = {key: replace(account) for key, account in self._made_accounts.items()}
        self.faults = replace(faults)  # a fresh copy: a request the last ones held goes on
        self.reset_stats()

    @property
    def key(self) -> str:
        """The first key (the generated one when none was given)."""
        return next(iter(self.plans))

    def reset_stats(self) -> None:
        """Counts from zero. A request that arrived before is not counted when it ends after, nor in
        progress meanwhile (a test's hung request, answered during the next test)."""
        with self._lock:
            self._generation = getattr(self, "_generation", 0) + 1
            self.requests = 0
            self.arrivals: deque[float] = deque(maxlen=1_000_000)  # clock() of each request, for benchmarks
            self.admitted: deque[float] = deque(maxlen=1_000_000)  # clock() of each request the limit let through
            self.by_status: Counter[int] = Counter()
            self.answered: Counter[str] = Counter()
            self.in_progress = self.most_in_progress = 0  # requests being answered now (since), the most at once
            self.admitted_by_key: dict[str, list[float]] = {}  # clock() of each request the limit let through
            self.status_by_key: dict[str, Counter[int]] = {}

    def refusal(self, key: str) -> tuple[int, dict[str, str]] | None:
        """The key's account refuses a request now: (status, headers); None: it does not."""
        account = self.accounts.get(key)
        if account is None:
            return None
        with self._lock:
            return account.refusal(self.clock())

    def admit(self, key: str) -> tuple[float | None, dict[str, str]]:
        """(None when the key may send now, else the seconds to wait; the headers that state the
        room left, when ``room_headers`` asks for them, and the key's quota), by the per-key limit."""
        account = self.accounts.get(key)
        rpm = account.rpm if account is not None and account.rpm is not None else self.rpm
        with self._lock:
            now = self.clock()
            wait, headers = None, {}
            if rpm > 0:
                window = self._windows.get(key) or LIMIT_KINDS[self.limit_kind](rpm, self.window)
                self._windows[key] = window
                wait = window.admit(now)
                headers = self._room_headers(*window.room(now))
            if wait is None:
                self.admitted.append(now)
                self.admitted_by_key.setdefault(key, []).append(now)
                if account is not None:
                    account.admit(now)
            if account is not None:
                headers.update(account.headers(now, rpm))
        return (None if wait is None else max(1, math.ceil(wait))), headers

    def _room_headers(self, remaining: int, reset: float) -> dict[str, str]:
        if self.room_headers is None:
            return {}
        prefix = "X-RateLimit-" if self.room_headers == "x-ratelimit" else "RateLimit-"
        seconds = max(1, math.ceil(reset - 1e-6))  # whole seconds, rounded up (not a float sum's last bit)
        return {
            f"{prefix}Limit": str(self.rpm),
            f"{prefix}Remaining": str(max(0, remaining)),
            f"{prefix}Reset": str(seconds),
        }

    def begin(self) -> int:
        """A request arrived: count what is in progress at once (how much a client keeps in flight).
        Returns the counts' generation, for ``record``."""
        with self._lock:
            self.in_progress += 1
            self.most_in_progress = max(self.most_in_progress, self.in_progress)
            return self._generation

    def end(self, generation: int | None = None) -> None:
        with self._lock:
            if generation is None or generation == self._generation:  # counted in progress by these counts
                self.in_progress -= 1

    def record(
        self, status: int, fields: dict[str, Any] | None = None, key: str | None = None, generation: int | None = None
    ) -> None:
        """Count an answer; not when the request arrived before the counts were last reset (``generation``)."""
        with self._lock:
            if generation is not None and generation != self._generation:
                return
            if key is not None and key in self.accounts:
                self.status_by_key.setdefault(key, Counter())[status] += 1
            self.requests += 1
            self.arrivals.append(self.clock())
            self.by_status[status] += 1
            if status == 200 and fields is not None:
                self.answered[fingerprint(fields)] += 1

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": self.requests,
                "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
                "answered": sum(self.answered.values()),
                "answered_unique": len(self.answered),
                "answered_twice": sum(1 for c in self.answered.values() if c > 1),
                "most_in_progress": self.most_in_progress,
            }
