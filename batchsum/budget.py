"""One rate budget per API key: where the next start time comes from, for everyone using the key.

The plan's limit belongs to the key, not to a process. A budget hands out start times for a key with
GCRA (a "theoretical arrival time", ``tat``): a reservation starts at ``max(tat, now, paused_until)``
and moves ``tat`` one interval past that start. The caller is told how long to wait, so waiters never
poll, and starts stay at least one interval apart however many processes ask. Nothing is leased: a
process that dies holds nothing (at most the one slot it reserved goes unused).

The budget also carries what every user of the key must hear at once: a 429 pause (every process
pauses, not only the one that got the 429), the pace in force when the service showed a lower limit,
and how many starts and 429s the key had in the last minute (the evidence the pacer judges a 429 by,
and what ``--dry-run`` shows). A pacer pushes these with its next reservation, in the same call.

Three places, chosen by a setting (``budget=`` / ``--budget`` / ``$BATCHSUM_BUDGET``):

- ``"machine"`` (the default): every batchsum process on this machine with the same key and base
  URL, through a small SQLite file in the user's cache folder (``platformdirs``), one row per budget,
  advanced in a ``BEGIN IMMEDIATE`` transaction; ``sqlite:///PATH`` names another file.
- ``"redis://HOST:PORT/DB"`` (or ``rediss://``): every process on every machine, through one Lua
  script that reads Redis' own ``TIME`` (no trust in the workers' clocks).
- ``"none"``: this process only (every batch in it with the same key and base URL shares one).

A budget is named by the client's ``identity``, a hash of base URL and key, never the key itself.

Shares. A run that may use only a fraction F of the key's rate (``share=``) reserves with a
``Share``: besides the key's ``tat`` the budget keeps one per shared run (its ``holder``), moved
``interval / F`` past each of its starts. Until that run's own ``tat`` has come, its reservation
reserves nothing on the key (the slot comes back ``deferred``, with the wait): it never holds a slot
of the key ahead of time, so the key's next slot stays free for everyone else, who are delayed by
at most the one slot the shared run took. Over any window the shared run holds at most
F x window / interval + 1 starts, and the others the rest, in the order they ask.
"""

from __future__ import annotations

import abc
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._retry import MAX_RETRY_AFTER
from .errors import BudgetError, location_secrets, one_line, redact, redact_location
from .options import DEFAULT_BUDGET, ENV_BUDGET, budget_spec

__all__ = [
    "Budget",
    "ProcessBudget",
    "SQLiteBudget",
    "RedisBudget",
    "Report",
    "Slot",
    "Share",
    "open_budget",
    "check_budget",
    "default_budget_path",
    "ENV_BUDGET",
]

MACHINE = DEFAULT_BUDGET
NONE = "none"
MAX_AHEAD = 3600.0  # a schedule further ahead than this is a clock that jumped back: start afresh
MAX_PAUSE = 2 * MAX_RETRY_AFTER  # likewise for a pause
MINUTE = 60
KEEP_SECONDS = 180  # per-second counts older than this are dropped
REASON_CHARS = 300
SETTING = "--budget (or $BATCHSUM_BUDGET)"


def default_budget_path() -> Path:
    """``budget.sqlite`` in the user's cache folder (``platformdirs``; honours ``$XDG_CACHE_HOME``)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("batchsum", appauthor=False)) / "budget.sqlite"


@dataclass(frozen=True)
class Report:
    """What a pacer tells the budget with its next reservation: a pause it must share, a pace it
    set, the attempts it started and the 429s it got since its last report. A pace lowered on
    evidence always applies; a pace raised while climbing (``pace_base``: the version it climbed
    from) applies only if nobody wrote one since, so a climb never undoes another's lowering."""

    pause_for: float = 0.0
    pause_reason: str | None = None
    pace: float | None = None
    pace_base: int | None = None
    started: int = 0
    refused: int = 0


NO_REPORT = Report()


@dataclass(frozen=True)
class Share:
    """A run that may use only ``fraction`` of the key's rate; ``holder`` names it (one name for
    every partition of a Dask or Spark job)."""

    holder: str
    fraction: float

    def own_interval(self, interval: float) -> float:
        """The spacing of this run's own starts when the key's are ``interval`` apart."""
        return max(0.0, interval) / self.fraction


@dataclass(frozen=True)
class Slot:
    """A reservation (or a look, ``start=False``): the wait until the start, and the budget's state."""

    wait: float
    at: float | None  # the reserved start on the budget's clock (None: a look)
    paused_for: float  # seconds of the shared pause left (0: none)
    pause_mark: float  # when the pause in force ends, on the budget's clock: a new value is a new pause
    pause_reason: str | None
    pace: float | None  # the shared pace in force; None: nobody set one
    pace_version: int  # bumped at every pace written: a value not seen before is someone else's
    starts: int  # attempts started in the last minute, every process together (as reported)
    refused: int  # 429s in the last minute, every process together (as reported)
    deferred: bool = False  # a shared run's own turn has not come: nothing reserved; ask again after ``wait``


@dataclass
class _State:
    tat: float = 0.0
    paused_until: float = 0.0
    reason: str | None = None
    pace: float | None = None
    pace_version: int = 0

    def advance(self, now: float, interval: float, report: Report, start: bool) -> float | None:
        """Apply ``report`` and, when ``start``, reserve the next start; returns its time or None."""
        if self.tat > now + MAX_AHEAD:
            self.tat = now
        if self.paused_until > now + MAX_PAUSE:
            self.paused_until = now
        if report.pause_for > 0 and now + report.pause_for > self.paused_until:
            self.paused_until = now + min(report.pause_for, MAX_PAUSE)
            self.reason = (report.pause_reason or "")[:REASON_CHARS] or None
        if report.pace is not None and report.pace_base in (None, self.pace_version):
            self.pace = report.pace
            self.pace_version += 1
        if not start:
            return None
        at = max(self.tat, now, self.paused_until)
        self.tat = at + max(0.0, interval)
        return at

    def slot(self, now: float, at: float | None, starts: int, refused: int) -> Slot:
        return Slot(
            wait=0.0 if at is None else at - now,
            at=at,
            paused_for=min(MAX_PAUSE, max(0.0, self.paused_until - now)),  # (now + x) - now may be x plus an ulp
            pause_mark=self.paused_until,
            pause_reason=self.reason,
            pace=self.pace,
            pace_version=self.pace_version,
            starts=starts,
            refused=refused,
        )


class Budget(abc.ABC):
    """Gives the next start time for a key. ``shared``: other processes may use it too."""

    shared = True
    where = ""  # for messages: "this process", "this machine (PATH)", "redis://host:port/db"

    @abc.abstractmethod
    async def reserve(
        self, interval: float, report: Report = NO_REPORT, *, start: bool = True, share: Share | None = None
    ) -> Slot:
        """Push ``report``; reserve a start ``interval`` seconds after the previous one (``start``).
        With ``share``, only once the shared run's own turn has come (else a ``deferred`` slot)."""

    async def check(self) -> None:
        """Raise ``BudgetError`` when the budget cannot be used (before anything is sent)."""
        await self.reserve(0.0, start=False)

    async def look(self) -> Slot:
        """The budget's state now, reserving nothing and creating nothing (``--dry-run``)."""
        return await self.reserve(0.0, start=False)

    async def aclose(self) -> None:  # noqa: B027 - most budgets hold nothing to let go of
        """Let go of connections (the budget's state stays for the others)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where})"


class _Counts:
    """Starts and 429s per second, for the last few minutes."""

    def __init__(self) -> None:
        self._seconds: dict[int, list[int]] = {}

    def add(self, second: int, starts: int, refused: int) -> None:
        entry = self._seconds.setdefault(second, [0, 0])
        entry[0] += starts
        entry[1] += refused
        if len(self._seconds) > KEEP_SECONDS:
            for old in [s for s in self._seconds if s < second - KEEP_SECONDS]:
                del self._seconds[old]

    def last_minute(self, now: float) -> tuple[int, int]:
        since = math.floor(now) - MINUTE
        starts = refused = 0
        for second, (s, r) in self._seconds.items():
            if second >= since:
                starts += s
                refused += r
        return starts, refused


class ProcessBudget(Budget):
    """The budget in this process's memory. Safe across threads and event loops (a thread lock,
    nothing awaited inside). ``ProcessBudget.for_key(id)`` is the one every batch in this process
    with that key shares; ``ProcessBudget()`` a private one (the engine's default, ``shared=False``)."""

    where = "this process"
    _registry: dict[str, ProcessBudget] = {}
    _registry_lock = threading.Lock()

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, shared: bool = False) -> None:
        self.shared = shared
        self._clock = clock
        self._lock = threading.Lock()
        self._state = _State(tat=-math.inf, paused_until=-math.inf)
        self._counts = _Counts()
        self._shares: dict[str, float] = {}  # holder -> its own tat

    @classmethod
    def for_key(cls, key_id: str) -> ProcessBudget:
        with cls._registry_lock:
            return cls._registry.setdefault(key_id, cls(shared=True))

    async def reserve(
        self, interval: float, report: Report = NO_REPORT, *, start: bool = True, share: Share | None = None
    ) -> Slot:
        with self._lock:
            now = self._clock()
            own = self._shares.get(share.holder, -math.inf) if start and share is not None else -math.inf
            turn = _share_wait(own, now)
            at = self._state.advance(now, interval, report, start and turn is None)
            if share is not None and at is not None:
                if len(self._shares) > 1024:  # forget runs long gone
                    self._shares = {h: t for h, t in self._shares.items() if t > now - KEEP_SECONDS}
                self._shares[share.holder] = at + share.own_interval(interval)
            if report.started or report.refused:
                self._counts.add(math.floor(now), report.started, report.refused)
            return _deferred(self._state.slot(now, at, *self._counts.last_minute(now)), turn)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    id TEXT PRIMARY KEY, tat REAL NOT NULL, paused_until REAL NOT NULL, reason TEXT,
    pace REAL, pace_version INTEGER NOT NULL, updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS shares (
    id TEXT NOT NULL, holder TEXT NOT NULL, tat REAL NOT NULL, PRIMARY KEY (id, holder)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counts (
    id TEXT NOT NULL, second INTEGER NOT NULL, starts INTEGER NOT NULL, refused INTEGER NOT NULL,
    PRIMARY KEY (id, second)
) WITHOUT ROWID;
"""


class SQLiteBudget(Budget):
    """Every process on this machine: one row per budget in a SQLite file, advanced in a
    ``BEGIN IMMEDIATE`` transaction on the machine's wall clock (the same in every process)."""

    def __init__(self, path: str | os.PathLike[str], key_id: str, *, default: bool = False) -> None:
        self.path = Path(path)
        self.id = key_id
        self.where = f"this machine ({self.path})"
        self._default = default
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _fail(self, problem: object) -> BudgetError:
        which = "the machine-wide rate budget" if self._default else "the rate budget"
        return BudgetError(
            f"cannot use {which} at {self.path}: {problem}; set {SETTING} to sqlite:///A/WRITABLE/FILE, "
            "redis://HOST:PORT/DB, or none"
        )

    def _connect(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise self._fail(getattr(exc, "strerror", None) or exc) from None
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # a budget lost in a power cut costs nothing
            db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            db.close()
            raise self._fail(exc) from None
        self._db = db
        return db

    async def reserve(
        self, interval: float, report: Report = NO_REPORT, *, start: bool = True, share: Share | None = None
    ) -> Slot:
        with self._lock:
            db = self._connect()
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    slot = self._reserve(db, interval, report, start, share)
                    db.execute("COMMIT")
                    return slot
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._fail(exc) from None

    def _reserve(
        self, db: sqlite3.Connection, interval: float, report: Report, start: bool, share: Share | None
    ) -> Slot:
        now = time.time()
        row = db.execute(
            "SELECT tat, paused_until, reason, pace, pace_version FROM budgets WHERE id=?", (self.id,)
        ).fetchone()
        state = _State(*row) if row else _State()
        turn = None
        if start and share is not None:
            own = db.execute("SELECT tat FROM shares WHERE id=? AND holder=?", (self.id, share.holder)).fetchone()
            turn = _share_wait(own[0] if own else -math.inf, now)
        at = state.advance(now, interval, report, start and turn is None)
        if share is not None and at is not None:
            db.execute(
                "INSERT OR REPLACE INTO shares VALUES (?, ?, ?)",
                (self.id, share.holder, at + share.own_interval(interval)),
            )
            db.execute("DELETE FROM shares WHERE id=? AND tat < ?", (self.id, now - KEEP_SECONDS))
        if row or start or report != NO_REPORT:
            db.execute(
                "INSERT OR REPLACE INTO budgets VALUES (?, ?, ?, ?, ?, ?, ?)",
                (self.id, state.tat, state.paused_until, state.reason, state.pace, state.pace_version, now),
            )
        if report.started or report.refused:
            db.execute(
                "INSERT INTO counts VALUES (?, ?, ?, ?) ON CONFLICT (id, second) DO UPDATE SET "
                "starts = starts + excluded.starts, refused = refused + excluded.refused",
                (self.id, math.floor(now), report.started, report.refused),
            )
            db.execute("DELETE FROM counts WHERE id=? AND second < ?", (self.id, math.floor(now) - KEEP_SECONDS))
        starts, refused = db.execute(
            "SELECT COALESCE(SUM(starts), 0), COALESCE(SUM(refused), 0) FROM counts WHERE id=? AND second >= ?",
            (self.id, math.floor(now) - MINUTE),
        ).fetchone()
        return _deferred(state.slot(now, at, int(starts), int(refused)), turn)

    async def look(self) -> Slot:
        if not self.path.exists():
            return _State().slot(time.time(), None, 0, 0)
        return await self.reserve(0.0, start=False)

    async def aclose(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


# GCRA on Redis' own clock: the same steps as _State.advance, in one atomic script. Numbers go back
# as strings (Redis turns Lua numbers into integers).
_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local interval, start = tonumber(ARGV[1]), ARGV[2] == '1'
local pause_for, reason, pace, refused = tonumber(ARGV[3]), ARGV[4], ARGV[5], tonumber(ARGV[6])
local max_ahead, max_pause, keep, minute = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local started, base = tonumber(ARGV[11]), ARGV[12]
local share_interval = tonumber(ARGV[13])
local deferred = ''
if start and share_interval ~= nil then
  local own = tonumber(redis.call('GET', KEYS[3])) or 0
  if own > now + max_ahead then own = 0 end
  if own > now + 0.000001 then
    deferred = string.format('%.6f', own - now)
    start = false
  end
end
local s = redis.call('HMGET', KEYS[1], 'tat', 'paused_until', 'reason', 'pace', 'pace_version')
local tat, paused_until = tonumber(s[1]) or 0, tonumber(s[2]) or 0
local old_reason, old_pace, version = s[3] or '', s[4] or '', tonumber(s[5]) or 0
if tat > now + max_ahead then tat = now end
if paused_until > now + max_pause then paused_until = now end
if pause_for > 0 and now + pause_for > paused_until then
  paused_until = now + math.min(pause_for, max_pause)
  old_reason = reason
end
if pace ~= '' and (base == '' or tonumber(base) == version) then old_pace = pace; version = version + 1 end
local at = nil
if start then
  at = math.max(tat, now, paused_until)
  tat = at + math.max(0, interval)
  if share_interval ~= nil then
    redis.call('SET', KEYS[3], string.format('%.6f', at + share_interval), 'EX', keep)
  end
end
redis.call('HSET', KEYS[1], 'tat', string.format('%.6f', tat), 'paused_until', string.format('%.6f', paused_until),
  'reason', old_reason, 'pace', old_pace, 'pace_version', version)
redis.call('EXPIRE', KEYS[1], 86400)
if started > 0 or refused > 0 then
  local k = KEYS[2] .. ':' .. math.floor(now)
  if started > 0 then redis.call('HINCRBY', k, 's', started) end
  if refused > 0 then redis.call('HINCRBY', k, 'r', refused) end
  redis.call('EXPIRE', k, keep)
end
local starts, refusals = 0, 0
local first = math.floor(now) - minute
for second = first, math.floor(now) do
  local c = redis.call('HMGET', KEYS[2] .. ':' .. second, 's', 'r')
  starts = starts + (tonumber(c[1]) or 0)
  refusals = refusals + (tonumber(c[2]) or 0)
end
local wait = 0
if at ~= nil then wait = at - now end
local at_text = ''
if at ~= nil then at_text = string.format('%.6f', at) end
return {string.format('%.6f', wait), at_text, string.format('%.6f', paused_until - now), string.format('%.6f', paused_until),
  old_reason, old_pace, tostring(version), tostring(starts), tostring(refusals), deferred}
"""

_REDIS_ATTEMPTS = 3


class RedisBudget(Budget):
    """Every process on every machine: GCRA in one Lua script on Redis' clock. The connection is
    made in the event loop that first uses it (one per loop)."""

    def __init__(self, url: str, key_id: str) -> None:
        try:
            import redis.asyncio  # noqa: F401
        except ImportError:
            raise BudgetError("a redis:// budget needs the redis package: pip install 'batchsum[redis]'") from None
        self.url = url
        self.id = key_id
        self.where = redact_location(url)
        self._secrets = location_secrets(url)
        self._keys = [f"batchsum:budget:{{{key_id}}}", f"batchsum:budget:{{{key_id}}}:counts"]
        self._clients: dict[int, Any] = {}

    def _client(self) -> Any:
        import asyncio

        import redis.asyncio

        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            client = redis.asyncio.Redis.from_url(
                self.url, socket_connect_timeout=5, socket_timeout=10, health_check_interval=30
            )
            entry = (loop, client, client.register_script(_LUA))
            self._clients[id(loop)] = entry
        return entry

    async def reserve(
        self, interval: float, report: Report = NO_REPORT, *, start: bool = True, share: Share | None = None
    ) -> Slot:
        import asyncio

        import redis.exceptions

        _, _, script = self._client()
        keys = self._keys if share is None else [*self._keys, f"{self._keys[0]}:share:{share.holder}"]
        args = [
            f"{max(0.0, interval):.6f}",
            "1" if start else "0",
            f"{max(0.0, report.pause_for):.6f}",
            (report.pause_reason or "")[:REASON_CHARS],
            "" if report.pace is None else f"{report.pace:.6f}",
            str(report.refused),
            str(MAX_AHEAD),
            str(MAX_PAUSE),
            str(KEEP_SECONDS),
            str(MINUTE),
            str(report.started),
            "" if report.pace_base is None else str(report.pace_base),
            "" if share is None else f"{share.own_interval(interval):.6f}",
        ]
        for attempt in range(_REDIS_ATTEMPTS):
            try:
                raw = await script(keys=keys, args=args)
                break
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
                if attempt == _REDIS_ATTEMPTS - 1:
                    raise BudgetError(
                        f"cannot reach the rate budget at {self.where} ({_said(exc, self._secrets)}) after "
                        f"{_REDIS_ATTEMPTS} tries; start it, or set {SETTING} to machine or none"
                    ) from None
                await asyncio.sleep(0.2 * 2**attempt)
            except redis.exceptions.RedisError as exc:
                raise BudgetError(f"the rate budget at {self.where} refused: {_said(exc, self._secrets)}") from None
        wait, at, paused_for, mark, reason, pace, version, starts, refused, deferred = (
            v.decode() if isinstance(v, bytes) else str(v) for v in raw
        )
        return Slot(
            wait=float(deferred) if deferred else float(wait),
            deferred=bool(deferred),
            at=float(at) if at else None,
            paused_for=min(MAX_PAUSE, max(0.0, float(paused_for))),
            pause_mark=float(mark),
            pause_reason=reason or None,
            pace=float(pace) if pace else None,
            pace_version=int(version),
            starts=int(starts),
            refused=int(refused),
        )

    async def aclose(self) -> None:
        import asyncio

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        entry = self._clients.pop(id(loop), None)
        if entry is not None:
            await entry[1].aclose()


def _share_wait(own_tat: float, now: float) -> float | None:
    """How long a shared run must still wait for its own turn (None: it has come)."""
    if own_tat > now + MAX_AHEAD:  # a clock that jumped back: start afresh
        return None
    return own_tat - now if own_tat > now + 1e-6 else None


def _deferred(slot: Slot, turn: float | None) -> Slot:
    """``slot``, or when the shared run's turn has not come, the wait for it with nothing reserved."""
    if turn is None:
        return slot
    return Slot(
        wait=turn,
        at=None,
        paused_for=slot.paused_for,
        pause_mark=slot.pause_mark,
        pause_reason=slot.pause_reason,
        pace=slot.pace,
        pace_version=slot.pace_version,
        starts=slot.starts,
        refused=slot.refused,
        deferred=True,
    )


async def check_budget(budget: Budget) -> None:
    """``budget.check()``, then let go of the connection made for it (it belongs to this loop)."""
    try:
        await budget.check()
    finally:
        await budget.aclose()


def _said(exc: BaseException, secrets: tuple[str, ...]) -> str:
    """What a library said, in one line, without credentials (it may quote the URL it was given)."""
    return redact(redact_location(one_line(exc)), secrets)


def open_budget(spec: str | Budget | None, identity: str) -> Budget:
    """The budget for ``spec`` and a key's ``identity`` (``AsyncClient.identity``, a hash of base URL
    and key): a ``Budget`` as it is; ``"none"``, ``"machine"``, ``"sqlite:///PATH"``,
    ``"redis://HOST:PORT/DB"`` (``rediss://``, ``unix://``); None reads ``$BATCHSUM_BUDGET``, else
    ``"machine"``. ``BudgetError`` for anything else (nothing is connected yet: ``await check()``)."""
    if isinstance(spec, Budget):
        return spec
    if spec is None:
        spec = budget_spec(None)
    if not isinstance(spec, str):
        raise BudgetError(f"invalid budget {spec!r}: use none, machine, sqlite:///PATH or redis://HOST:PORT/DB")
    key_id = identity
    lowered = spec.strip().lower()
    if lowered in (NONE, "process"):
        return ProcessBudget.for_key(key_id)
    if lowered == MACHINE:
        return SQLiteBudget(default_budget_path(), key_id, default=True)
    if lowered.startswith("sqlite:///"):
        return SQLiteBudget(spec.strip()[len("sqlite://") :], key_id)
    if lowered.startswith(("redis://", "rediss://", "unix://")):
        return RedisBudget(spec.strip(), key_id)
    raise BudgetError(
        f"unknown budget {redact_location(spec)!r}: set {SETTING} to none, machine, sqlite:///PATH "
        "or redis://HOST:PORT/DB"
    )
