"""One rate budget per API key: where the next start time comes from, for everyone using the key.

The plan's limit belongs to the key, not to a process. A budget hands out start times for a key with
GCRA (a "theoretical arrival time", ``tat``): a reservation starts at ``max(tat, last + interval, now,
paused_until)`` and moves ``tat`` one interval past that start. The caller is told how long to wait,
so waiters never poll. A start is then *committed* (``commit``): the budget checks, atomically, that
the key's last committed start (``last``, every process's) is at least one interval back, and
records this one as the last. So the spacing counts from when each start really went out, not from
when it was due: a start that goes out late (a busy event loop, a slow process) pushes the next one
back instead of letting it close the gap. A reservation due at once is committed in the same call.
Nothing is leased: a process that dies holds nothing (at most the one slot it reserved goes unused).

The budget also remembers, per (key, service), what a run may reuse later (``recall``/``remember``):
when the key was last answered in each mode, whether a service's stated room was contradicted, and
the limits found. Entries carry the time they were written; readers judge their age. The key is
stored only as its short hash (``run.spec.key_hash``). ``"none"`` remembers nothing.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..run.spec import DEFAULT_BUDGET, ENV_BUDGET, budget_spec
from ..service.errors import BudgetError, location_secrets, one_line, redact, redact_location
from ..service.retry import MAX_RETRY_AFTER

__all__ = [
    "Budget",
    "ProcessBudget",
    "SQLiteBudget",
    "RedisBudget",
    "Report",
    "Slot",
    "Share",
    "Remembered",
    "open_budget",
    "check_budget",
    "default_budget_path",
    "ENV_BUDGET",
]

T = TypeVar("T")
MACHINE = DEFAULT_BUDGET
NONE = "none"
MAX_AHEAD = 3600.0  # a schedule further ahead than this (beyond its interval) is a clock that jumped back
ON_TIME = 1e-6  # within a microsecond is on time: a float sum can land an ulp short
RECORD_SECONDS = 7 * 86400  # remembered entries older than this are dropped (readers use their own ages)
_SET_UP_ATTEMPTS = 10  # a new file opened by several processes at once: tries to switch it to WAL
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
    committed: bool = False  # the start is recorded as the key's last: it goes now (``wait`` is 0)


@dataclass(frozen=True)
class Remembered:
    """One remembered entry of a (key, service) pair: ``name`` (``answered:1``, ``room_contradicted``,
    ``limit`` ...), its ``value`` (plain text, often JSON) and when it was written (Unix time)."""

    key_hash: str
    service: str
    name: str
    value: str
    at: float


# What a call to the budget does besides taking the report: look; reserve (committed at once when
# due now); commit; reserve and never commit at once (the caller asks its own limiter first).
LOOK, RESERVE, COMMIT, RESERVE_ONLY = 0, 1, 2, 3


@dataclass
class _State:
    tat: float = 0.0
    paused_until: float = 0.0
    reason: str | None = None
    pace: float | None = None
    pace_version: int = 0
    last: float = 0.0  # the key's last committed start

    def advance(self, now: float, interval: float, report: Report, what: int) -> tuple[float | None, bool]:
        """Apply ``report``; then reserve the next start (``RESERVE``: its time, and whether it was
        committed at once), or commit a start now (``COMMIT``: now when the last committed start is
        an interval back and no pause holds, else the time it may be tried again). A ``LOOK`` does
        neither: (None, False)."""
        interval = max(0.0, interval)
        if self.tat > now + interval + MAX_AHEAD:
            self.tat = now
        if self.last > now + MAX_AHEAD:
            self.last = now - interval
        if self.paused_until > now + MAX_PAUSE:
            self.paused_until = now
        if report.pause_for > 0 and now + report.pause_for > self.paused_until:
            self.paused_until = now + min(report.pause_for, MAX_PAUSE)
            self.reason = (report.pause_reason or "")[:REASON_CHARS] or None
        if report.pace is not None and report.pace_base in (None, self.pace_version):
            self.pace = report.pace
            self.pace_version += 1
        if what == LOOK:
            return None, False
        due = max(self.last + interval, self.paused_until)
        if what == COMMIT:
            if due > now + ON_TIME:
                return due, False
            self.last = now
            return now, True
        at = max(self.tat, due, now)
        self.tat = at + interval
        if at <= now + ON_TIME and what == RESERVE:
            self.last = now
            return now, True
        return at, False

    def slot(self, now: float, at: float | None, starts: int, refused: int, committed: bool = False) -> Slot:
        return Slot(
            wait=0.0 if at is None or committed else max(0.0, at - now),
            at=at,
            paused_for=min(MAX_PAUSE, max(0.0, self.paused_until - now)),  # (now + x) - now may be x plus an ulp
            pause_mark=self.paused_until,
            pause_reason=self.reason,
            pace=self.pace,
            pace_version=self.pace_version,
            starts=starts,
            refused=refused,
            committed=committed,
        )


class Budget(abc.ABC):
    """Gives the next start time for a key. ``shared``: other processes may use it too."""

    shared = True
    where = ""  # for messages: "this process", "this machine (PATH)", "redis://host:port/db"

    async def reserve(
        self,
        interval: float,
        report: Report = NO_REPORT,
        *,
        start: bool = True,
        share: Share | None = None,
        commit: bool = True,
    ) -> Slot:
        """Push ``report``; reserve a start ``interval`` seconds after the key's previous one
        (``start``; else only look). With ``share``, only once the shared run's own turn has come
        (else a ``deferred`` slot). A start due at once comes back ``committed`` (unless not
        ``commit``); any other must be committed when its wait is over (``commit``)."""
        what = (RESERVE if commit else RESERVE_ONLY) if start else LOOK
        return await self._call(what, interval, report, share)

    async def commit(self, interval: float, report: Report = NO_REPORT, *, share: Share | None = None) -> Slot:
        """Push ``report``; record a start now if the key's last committed start is ``interval``
        back and no pause holds (``committed``), else the ``wait`` before trying again."""
        return await self._call(COMMIT, interval, report, share)

    @abc.abstractmethod
    async def _call(self, what: int, interval: float, report: Report, share: Share | None) -> Slot:
        """One atomic step on the budget's state: ``LOOK``, ``RESERVE`` or ``COMMIT``."""

    async def check(self) -> None:
        """Raise ``BudgetError`` when the budget cannot be used (before anything is sent)."""
        await self.reserve(0.0, start=False)

    async def look(self) -> Slot:
        """The budget's state now, reserving nothing and creating nothing (``--dry-run``)."""
        return await self.reserve(0.0, start=False)

    async def recall(self, key_hash: str, service: str) -> list[Remembered]:
        """What is remembered of ``key_hash`` at ``service`` (nothing, for a budget that remembers nothing)."""
        return []

    async def remember(self, key_hash: str, service: str, entries: dict[str, str]) -> None:  # noqa: B027
        """Remember ``entries`` (name -> value) of ``key_hash`` at ``service``, stamped now."""

    async def remembered(self) -> list[Remembered]:
        """Every entry remembered, of every key and service (``batchsum limits``)."""
        return []

    async def forget(self, key_hash: str | None = None, service: str | None = None, name: str | None = None) -> int:
        """Forget the entries that match (None matches all); how many were forgotten."""
        return 0

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
        self._state = _State(tat=-math.inf, paused_until=-math.inf, last=-math.inf)
        self._counts = _Counts()
        self._shares: dict[str, float] = {}  # holder -> its own tat

    @classmethod
    def for_key(cls, key_id: str) -> ProcessBudget:
        with cls._registry_lock:
            return cls._registry.setdefault(key_id, cls(shared=True))

    async def _call(self, what: int, interval: float, report: Report, share: Share | None) -> Slot:
        with self._lock:
            now = self._clock()
            turn = None
            if what in (RESERVE, RESERVE_ONLY) and share is not None:
                turn = _share_wait(self._shares.get(share.holder, -math.inf), now, share.own_interval(interval))
            at, committed = self._state.advance(now, interval, report, LOOK if turn is not None else what)
            if share is not None and what in (RESERVE, RESERVE_ONLY) and at is not None:
                if len(self._shares) > 1024:  # forget runs long gone
                    self._shares = {h: t for h, t in self._shares.items() if t > now - KEEP_SECONDS}
                self._shares[share.holder] = at + share.own_interval(interval)
            if report.started or report.refused:
                self._counts.add(math.floor(now), report.started, report.refused)
            return _deferred(self._state.slot(now, at, *self._counts.last_minute(now), committed), turn)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    id TEXT PRIMARY KEY, tat REAL NOT NULL, paused_until REAL NOT NULL, reason TEXT,
    pace REAL, pace_version INTEGER NOT NULL, updated REAL NOT NULL, last REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS remembered (
    key_hash TEXT NOT NULL, service TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (key_hash, service, name)
) WITHOUT ROWID;
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
        for attempt in range(_SET_UP_ATTEMPTS):
            try:
                self._set_up(db)
                break
            except sqlite3.OperationalError as exc:
                # Processes opening a new file together: switching it to WAL can answer "locked"
                # at once, without the busy timeout. Another moment, and it is done.
                if "locked" not in str(exc) or attempt == _SET_UP_ATTEMPTS - 1:
                    db.close()
                    raise self._fail(exc) from None
                time.sleep(0.02 * (attempt + 1))
            except sqlite3.Error as exc:
                db.close()
                raise self._fail(exc) from None
        self._db = db
        return db

    @staticmethod
    def _set_up(db: sqlite3.Connection) -> None:
        """WAL, and the tables (a file from before commits gains its column), in one transaction."""
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # a budget lost in a power cut costs nothing
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            columns = {row[1] for row in db.execute("PRAGMA table_info(budgets)")}
            if "last" not in columns:
                db.execute("ALTER TABLE budgets ADD COLUMN last REAL NOT NULL DEFAULT 0")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _transaction(self, step: Callable[[sqlite3.Connection], T]) -> T:
        """``step`` in one ``BEGIN IMMEDIATE`` transaction; a ``BudgetError`` naming the file if it fails."""
        with self._lock:
            db = self._connect()
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    result = step(db)
                    db.execute("COMMIT")
                    return result
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._fail(exc) from None

    async def _call(self, what: int, interval: float, report: Report, share: Share | None) -> Slot:
        return self._transaction(lambda db: self._step(db, what, interval, report, share))

    def _step(self, db: sqlite3.Connection, what: int, interval: float, report: Report, share: Share | None) -> Slot:
        now = time.time()
        row = db.execute(
            "SELECT tat, paused_until, reason, pace, pace_version, last FROM budgets WHERE id=?", (self.id,)
        ).fetchone()
        state = _State(*row) if row else _State()
        turn = None
        if what in (RESERVE, RESERVE_ONLY) and share is not None:
            own = db.execute("SELECT tat FROM shares WHERE id=? AND holder=?", (self.id, share.holder)).fetchone()
            turn = _share_wait(own[0] if own else -math.inf, now, share.own_interval(interval))
        at, committed = state.advance(now, interval, report, LOOK if turn is not None else what)
        if share is not None and what in (RESERVE, RESERVE_ONLY) and at is not None:
            db.execute(
                "INSERT OR REPLACE INTO shares VALUES (?, ?, ?)",
                (self.id, share.holder, at + share.own_interval(interval)),
            )
            db.execute("DELETE FROM shares WHERE id=? AND tat < ?", (self.id, now - KEEP_SECONDS))
        if row or what != LOOK or report != NO_REPORT:
            db.execute(
                "INSERT OR REPLACE INTO budgets (id, tat, paused_until, reason, pace, pace_version, updated, last) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (self.id, state.tat, state.paused_until, state.reason, state.pace, state.pace_version, now, state.last),
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
        return _deferred(state.slot(now, at, int(starts), int(refused), committed), turn)

    async def recall(self, key_hash: str, service: str) -> list[Remembered]:
        if not self.path.exists():
            return []
        return self._transaction(
            lambda db: self._entries(db, "key_hash=? AND service=?", (key_hash, service)),
        )

    async def remember(self, key_hash: str, service: str, entries: dict[str, str]) -> None:
        now = time.time()

        def write(db: sqlite3.Connection) -> None:
            db.executemany(
                "INSERT OR REPLACE INTO remembered VALUES (?, ?, ?, ?, ?)",
                [(key_hash, service, name, value, now) for name, value in entries.items()],
            )
            db.execute("DELETE FROM remembered WHERE at < ?", (now - RECORD_SECONDS,))

        self._transaction(write)

    async def remembered(self) -> list[Remembered]:
        if not self.path.exists():
            return []
        return self._transaction(lambda db: self._entries(db, "1=1", ()))

    async def forget(self, key_hash: str | None = None, service: str | None = None, name: str | None = None) -> int:
        if not self.path.exists():
            return 0
        where, args = _matching(key_hash=key_hash, service=service, name=name)
        return self._transaction(lambda db: db.execute(f"DELETE FROM remembered WHERE {where}", args).rowcount)

    @staticmethod
    def _entries(db: sqlite3.Connection, where: str, args: tuple[str, ...]) -> list[Remembered]:
        rows = db.execute(
            f"SELECT key_hash, service, name, value, at FROM remembered WHERE {where} AND at >= ? "
            "ORDER BY service, key_hash, name",
            (*args, time.time() - RECORD_SECONDS),
        ).fetchall()
        return [Remembered(*row) for row in rows]

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
# as strings (Redis turns Lua numbers into integers). ARGV[2]: LOOK, RESERVE, COMMIT or RESERVE_ONLY.
_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local interval, what = math.max(0, tonumber(ARGV[1])), tonumber(ARGV[2])
local pause_for, reason, pace, refused = tonumber(ARGV[3]), ARGV[4], ARGV[5], tonumber(ARGV[6])
local max_ahead, max_pause, keep, minute = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local started, base = tonumber(ARGV[11]), ARGV[12]
local share_interval = tonumber(ARGV[13])
local on_time = tonumber(ARGV[14])
local deferred = ''
if (what == 1 or what == 3) and share_interval ~= nil then
  local own = tonumber(redis.call('GET', KEYS[3])) or 0
  if own > now + share_interval + max_ahead then own = 0 end
  if own > now + on_time then
    deferred = string.format('%.6f', own - now)
    what = 0
  end
end
local s = redis.call('HMGET', KEYS[1], 'tat', 'paused_until', 'reason', 'pace', 'pace_version', 'last')
local tat, paused_until = tonumber(s[1]) or 0, tonumber(s[2]) or 0
local old_reason, old_pace, version = s[3] or '', s[4] or '', tonumber(s[5]) or 0
local last = tonumber(s[6]) or 0
if tat > now + interval + max_ahead then tat = now end
if last > now + max_ahead then last = now - interval end
if paused_until > now + max_pause then paused_until = now end
if pause_for > 0 and now + pause_for > paused_until then
  paused_until = now + math.min(pause_for, max_pause)
  old_reason = reason
end
if pace ~= '' and (base == '' or tonumber(base) == version) then old_pace = pace; version = version + 1 end
local at = nil
local committed = '0'
if what ~= 0 then
  local due = math.max(last + interval, paused_until)
  if what == 2 then
    if due > now + on_time then at = due else at = now; last = now; committed = '1' end
  else
    at = math.max(tat, due, now)
    tat = at + interval
    if at <= now + on_time and what == 1 then at = now; last = now; committed = '1' end
    if share_interval ~= nil then
      redis.call('SET', KEYS[3], string.format('%.6f', at + share_interval), 'EX', keep)
    end
  end
end
redis.call('HSET', KEYS[1], 'tat', string.format('%.6f', tat), 'paused_until', string.format('%.6f', paused_until),
  'reason', old_reason, 'pace', old_pace, 'pace_version', version, 'last', string.format('%.6f', last))
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
if at ~= nil and committed == '0' then wait = math.max(0, at - now) end
local at_text = ''
if at ~= nil then at_text = string.format('%.6f', at) end
return {string.format('%.6f', wait), at_text, string.format('%.6f', paused_until - now), string.format('%.6f', paused_until),
  old_reason, old_pace, tostring(version), tostring(starts), tostring(refusals), deferred, committed}
"""

_REDIS_ATTEMPTS = 3
_REMEMBERED = "batchsum:remembered:"  # + KEY_HASH:SERVICE -> a hash of name -> "AT VALUE"


def _decode_entries(key_hash: str, service: str, raw: dict[Any, Any]) -> list[Remembered]:
    """A remembered hash's fields as entries, the old and the unreadable left out."""
    oldest = time.time() - RECORD_SECONDS
    out = []
    for field_name, field_value in raw.items():
        name = field_name.decode() if isinstance(field_name, bytes) else str(field_name)
        text = field_value.decode() if isinstance(field_value, bytes) else str(field_value)
        at, _, value = text.partition(" ")
        try:
            stamp = float(at)
        except ValueError:
            continue
        if stamp >= oldest:
            out.append(Remembered(key_hash, service, name, value, stamp))
    return sorted(out, key=lambda e: e.name)


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

    async def _call(self, what: int, interval: float, report: Report, share: Share | None) -> Slot:
        _, _, script = self._client()
        keys = self._keys if share is None else [*self._keys, f"{self._keys[0]}:share:{share.holder}"]
        args = [
            f"{max(0.0, interval):.6f}",
            str(what),
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
            "" if share is None or what not in (RESERVE, RESERVE_ONLY) else f"{share.own_interval(interval):.6f}",
            str(ON_TIME),
        ]
        raw = await self._redis(lambda: script(keys=keys, args=args))
        wait, at, paused_for, mark, reason, pace, version, starts, refused, deferred, committed = (
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
            committed=committed == "1",
        )

    async def _redis(self, command: Callable[[], Awaitable[T]]) -> T:
        """``command`` on the budget's Redis, tried up to three times when the connection fails."""
        import asyncio

        import redis.exceptions

        for attempt in range(_REDIS_ATTEMPTS):
            try:
                return await command()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
                if attempt == _REDIS_ATTEMPTS - 1:
                    raise BudgetError(
                        f"cannot reach the rate budget at {self.where} ({_said(exc, self._secrets)}) after "
                        f"{_REDIS_ATTEMPTS} tries; start it, or set {SETTING} to machine or none"
                    ) from None
                await asyncio.sleep(0.2 * 2**attempt)
            except redis.exceptions.RedisError as exc:
                raise BudgetError(f"the rate budget at {self.where} refused: {_said(exc, self._secrets)}") from None
        raise AssertionError("unreachable")

    def _record_key(self, key_hash: str, service: str) -> str:
        return f"{_REMEMBERED}{key_hash}:{service}"

    async def recall(self, key_hash: str, service: str) -> list[Remembered]:
        _, client, _ = self._client()
        raw = await self._redis(lambda: client.hgetall(self._record_key(key_hash, service)))
        return _decode_entries(key_hash, service, raw)

    async def remember(self, key_hash: str, service: str, entries: dict[str, str]) -> None:
        _, client, _ = self._client()
        key, now = self._record_key(key_hash, service), time.time()

        async def write() -> None:
            async with client.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping={name: f"{now:.6f} {value}" for name, value in entries.items()})
                pipe.expire(key, int(RECORD_SECONDS))
                await pipe.execute()

        await self._redis(write)

    async def remembered(self) -> list[Remembered]:
        _, client, _ = self._client()

        async def scan() -> list[Remembered]:
            out: list[Remembered] = []
            async for raw_key in client.scan_iter(match=f"{_REMEMBERED}*", count=500):
                name = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
                key_hash, _, service = name[len(_REMEMBERED) :].partition(":")
                out.extend(_decode_entries(key_hash, service, await client.hgetall(name)))
            return sorted(out, key=lambda e: (e.service, e.key_hash, e.name))

        return await self._redis(scan)

    async def forget(self, key_hash: str | None = None, service: str | None = None, name: str | None = None) -> int:
        _, client, _ = self._client()
        wanted = {"key_hash": key_hash, "service": service, "name": name}
        matching = [
            entry
            for entry in await self.remembered()
            if all(value is None or getattr(entry, field) == value for field, value in wanted.items())
        ]

        async def delete() -> int:
            async with client.pipeline(transaction=False) as pipe:
                for entry in matching:
                    pipe.hdel(self._record_key(entry.key_hash, entry.service), entry.name)
                return sum(int(n) for n in await pipe.execute())

        return await self._redis(delete) if matching else 0

    async def aclose(self) -> None:
        import asyncio

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        entry = self._clients.pop(id(loop), None)
        if entry is not None:
            await entry[1].aclose()


def _share_wait(own_tat: float, now: float, own_interval: float) -> float | None:
    """How long a shared run must still wait for its own turn (None: it has come)."""
    if own_tat > now + own_interval + MAX_AHEAD:  # a clock that jumped back: start afresh
        return None
    return own_tat - now if own_tat > now + ON_TIME else None


def _matching(**columns: str | None) -> tuple[str, tuple[str, ...]]:
    """A SQL condition matching the columns given (None matches any), and its arguments."""
    given = {name: value for name, value in columns.items() if value is not None}
    where = " AND ".join(f"{name}=?" for name in given) or "1=1"
    return where, tuple(given.values())


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
