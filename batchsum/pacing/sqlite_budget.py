"""``SQLiteBudget``: a key's budget shared by every process on this machine, one row per budget in a
SQLite file (the default, ``"machine"``), with the key's counts per tick, the lead of its search, the
entries remembered of each key, and the runs' registry (who is on each key, a job's stop).
"""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from ..service.errors import BudgetError
from .exchange import (
    ENTRY_CHARS,
    LEASE_SECONDS,
    LOOK,
    NO_REPORT,
    RECORD_SECONDS,
    RESERVE,
    RESERVE_ONLY,
    RUN_LEASE_SECONDS,
    SETTING,
    SHARED_SECONDS,
    STOP_SECONDS,
    Budget,
    BudgetReset,
    Lead,
    Member,
    Remembered,
    Report,
    RunEntry,
    Share,
    Slot,
)
from .gcra import KEEP_SECONDS, MINUTE, State, deferred, share_wait
from .ledger import KEEP_TICKS, LEDGER_SECONDS, Ledger, Tally, tick_of

__all__ = ["SQLiteBudget"]

T = TypeVar("T")
_SET_UP_ATTEMPTS = 10  # a new file opened by several processes at once: tries to switch it to WAL

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
CREATE TABLE IF NOT EXISTS tallies (
    id TEXT NOT NULL, tick INTEGER NOT NULL, starts INTEGER NOT NULL, answered INTEGER NOT NULL,
    refused INTEGER NOT NULL, PRIMARY KEY (id, tick)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS quota_counts (
    id TEXT NOT NULL, period TEXT NOT NULL, used INTEGER NOT NULL, expires REAL NOT NULL, PRIMARY KEY (id, period)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leads (
    id TEXT PRIMARY KEY, holder TEXT, until REAL NOT NULL, state TEXT, state_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS names (
    id TEXT PRIMARY KEY, key_hash TEXT NOT NULL, service TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT NOT NULL, member TEXT NOT NULL, run_id TEXT NOT NULL, entry TEXT NOT NULL, seen REAL NOT NULL,
    PRIMARY KEY (id, member)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS stops (
    id TEXT NOT NULL, run_id TEXT NOT NULL, cause TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (id, run_id)
) WITHOUT ROWID;
"""
SCHEMA_VERSION = "3"  # 3: the epoch, the runs' registry and a job's stops (tables made in older files as they open)
_COLUMNS = {"last": "REAL NOT NULL DEFAULT 0", "pace_at": "REAL NOT NULL DEFAULT 0"}  # added to old files
_TALLY = (
    "INSERT INTO tallies VALUES (?, ?, ?, ?, ?) ON CONFLICT (id, tick) DO UPDATE SET "
    "starts = starts + excluded.starts, answered = answered + excluded.answered, refused = refused + excluded.refused"
)


class _SQLiteFile(Budget):
    """A budget's SQLite file: its connection, its transactions (``BEGIN IMMEDIATE``), and the
    entries remembered of each key there."""

    def __init__(self, path: str | os.PathLike[str], key_id: str, *, default: bool = False) -> None:
        self.path = Path(path)
        self.id = key_id
        self.where = f"this machine ({self.path})" if default else f"the file {self.path}"
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
            if self._default:  # the cache folder; a folder the user named must exist (a typo makes none)
                self.path.parent.mkdir(parents=True, exist_ok=True)
            elif not self.path.parent.is_dir():
                raise FileNotFoundError(errno.ENOENT, f"its folder {self.path.parent} does not exist")
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise self._fail(getattr(exc, "strerror", None) or exc) from None
        for attempt in range(_SET_UP_ATTEMPTS):
            try:
                _set_up(db)
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
        self.epoch = _epoch(db)
        return db

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

    async def recall(self, key_hash: str, service: str) -> list[Remembered]:
        if not self.path.exists():  # a dry run creates nothing
            return []

        def read(db: sqlite3.Connection) -> list[Remembered]:
            db.execute("INSERT OR REPLACE INTO names VALUES (?, ?, ?)", (self.id, key_hash, service))
            return _entries(db, "key_hash=? AND service=?", (key_hash, service))

        return self._transaction(read)

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
        return self._transaction(lambda db: _entries(db, "1=1", ()))

    async def forget(self, key_hash: str | None = None, service: str | None = None, name: str | None = None) -> int:
        if not self.path.exists():
            return 0
        where, args = _matching(key_hash=key_hash, service=service, name=name)

        def delete(db: sqlite3.Connection) -> int:
            if name is None:  # the keys' shared pace, counts and search go with what is remembered
                ids = f"SELECT id FROM names WHERE {where}"
                db.execute(f"UPDATE budgets SET pace = NULL, pace_at = 0 WHERE id IN ({ids})", args)
                for table in ("tallies", "leads", "shares", "runs", "stops"):
                    db.execute(f"DELETE FROM {table} WHERE id IN ({ids})", args)
            return int(db.execute(f"DELETE FROM remembered WHERE {where}", args).rowcount)

        return self._transaction(delete)

    async def aclose(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


class SQLiteBudget(_SQLiteFile):
    """Every process on this machine: one row per budget in a SQLite file, advanced in a
    ``BEGIN IMMEDIATE`` transaction on the machine's wall clock (the same in every process)."""

    async def _call(self, what: int, interval: float, report: Report, share: Share | None) -> Slot:
        return self._transaction(lambda db: self._step(db, what, interval, report, share))

    def _step(self, db: sqlite3.Connection, what: int, interval: float, report: Report, share: Share | None) -> Slot:
        now = time.time()
        row = db.execute(
            "SELECT tat, paused_until, reason, pace, pace_version, last, pace_at, updated FROM budgets WHERE id=?",
            (self.id,),
        ).fetchone()
        state = State(*row) if row else State()
        turn = None
        if what in (RESERVE, RESERVE_ONLY) and share is not None:
            own = db.execute("SELECT tat FROM shares WHERE id=? AND holder=?", (self.id, share.holder)).fetchone()
            turn = share_wait(own[0] if own else -math.inf, now, share.own_interval(interval))
        at, committed = state.advance(now, interval, report, LOOK if turn is not None else what)
        if share is not None and what in (RESERVE, RESERVE_ONLY) and at is not None:
            db.execute(
                "INSERT OR REPLACE INTO shares VALUES (?, ?, ?)",
                (self.id, share.holder, at + share.own_interval(interval)),
            )
            db.execute("DELETE FROM shares WHERE id=? AND tat < ?", (self.id, now - KEEP_SECONDS))
        if row or what != LOOK or report != NO_REPORT:
            db.execute(
                "INSERT OR REPLACE INTO budgets (id, tat, paused_until, reason, pace, pace_version, updated, last, "
                "pace_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    self.id,
                    state.tat,
                    state.paused_until,
                    state.reason,
                    state.pace,
                    state.pace_version,
                    state.updated,
                    state.last,
                    state.pace_at,
                ),
            )
        stop = self._registry_step(db, now, report)
        tallies = [(self.id, tick_of(now), 1, 0, 0)] if committed else []
        tallies += [(self.id, tick_of(now - age), 0, 1, 0) for age in report.answered]
        tallies += [(self.id, tick_of(now - age), 0, 0, 1) for age in report.refused]
        if tallies:
            db.executemany(_TALLY, tallies)
            if committed and tick_of(now) % 100 == 0:  # now and then, the old ticks go
                db.execute("DELETE FROM tallies WHERE id=? AND tick < ?", (self.id, tick_of(now) - KEEP_TICKS))
        starts, answered, refused = db.execute(
            "SELECT COALESCE(SUM(starts), 0), COALESCE(SUM(answered), 0), COALESCE(SUM(refused), 0) FROM tallies "
            "WHERE id=? AND tick >= ?",
            (self.id, tick_of(now - MINUTE)),
        ).fetchone()
        slot = deferred(state.slot(now, at, int(starts), int(refused), int(answered), committed), turn)
        return dataclasses.replace(slot, epoch=self.epoch, stop=stop)

    def _registry_step(self, db: sqlite3.Connection, now: float, report: Report) -> str | None:
        """The report's entry kept (lapsed ones dropped); the calling run's job's stop, if any."""
        if report.run is None:
            return None
        if report.entry is not None and len(report.entry) <= ENTRY_CHARS:
            db.execute(
                "INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?)",
                (self.id, report.run.member, report.run.run_id, report.entry, now),
            )
            db.execute("DELETE FROM runs WHERE id=? AND seen < ?", (self.id, now - RUN_LEASE_SECONDS))
        row = db.execute("SELECT cause FROM stops WHERE id=? AND run_id=?", (self.id, report.run.run_id)).fetchone()
        return str(row[0]) if row else None

    async def runs(self) -> list[RunEntry]:
        if not self.path.exists():
            return []

        def read(db: sqlite3.Connection) -> list[RunEntry]:
            now = time.time()
            rows = db.execute(
                "SELECT run_id, member, entry, seen FROM runs WHERE id=? AND seen >= ? ORDER BY run_id, member",
                (self.id, now - RUN_LEASE_SECONDS),
            ).fetchall()
            found = (RunEntry.read(run_id, member, entry, seen, now) for run_id, member, entry, seen in rows)
            return [entry for entry in found if entry is not None]

        return self._transaction(read)

    async def leave(self, member: Member) -> None:
        self._transaction(lambda db: db.execute("DELETE FROM runs WHERE id=? AND member=?", (self.id, member.member)))

    async def post_stop(self, run_id: str, cause: str) -> None:
        def write(db: sqlite3.Connection) -> None:
            now = time.time()
            db.execute("INSERT OR REPLACE INTO stops VALUES (?, ?, ?, ?)", (self.id, run_id, cause, now))
            db.execute("DELETE FROM stops WHERE at < ?", (now - STOP_SECONDS,))

        self._transaction(write)

    async def ledger(self, seconds: float = LEDGER_SECONDS) -> Ledger:
        def read(db: sqlite3.Connection) -> Ledger:
            now = time.time()
            rows = db.execute(
                "SELECT tick, starts, answered, refused FROM tallies WHERE id=? AND tick >= ?",
                (self.id, tick_of(now - seconds)),
            ).fetchall()
            return Ledger.of(now, [Tally(*row) for row in rows], seconds)

        return self._transaction(read)

    async def lead(self, holder: str, state: str | None = None, *, release: bool = False) -> Lead:
        def step(db: sqlite3.Connection) -> Lead:
            now = time.time()
            row = db.execute("SELECT holder, until, state, state_at FROM leads WHERE id=?", (self.id,)).fetchone()
            held, until, published, at = row if row else (None, 0.0, None, 0.0)
            if held is None or held == holder or until < now or until > now + 2 * LEASE_SECONDS:
                if state is not None:
                    published, at = state, now
                held, until = (None, 0.0) if release else (holder, now + LEASE_SECONDS)
                db.execute("INSERT OR REPLACE INTO leads VALUES (?, ?, ?, ?, ?)", (self.id, held, until, published, at))
            return Lead(held, published if now - at <= SHARED_SECONDS else None, at, now)

        return self._transaction(step)

    async def quota_claim(
        self, periods: Sequence[tuple[str, float]], limit: int | None, epoch: str | None = None
    ) -> int | None:
        def claim(db: sqlite3.Connection) -> int | None:
            if epoch is not None and epoch != self.epoch:
                raise BudgetReset(self.epoch)
            return _quota_claim(db, self.id, periods, limit)

        return self._transaction(claim)

    async def quota_restore(self, period: str, at_least: int, keep: float) -> None:
        self._transaction(
            lambda db: db.execute(
                "INSERT INTO quota_counts VALUES (?, ?, ?, ?) ON CONFLICT (id, period) DO UPDATE SET "
                "used = MAX(used, excluded.used)",
                (self.id, period, at_least, time.time() + keep),
            )
        )

    async def quota_give_back(self, periods: Sequence[str]) -> None:
        self._transaction(lambda db: db.executemany(_GIVE_BACK, [(self.id, name) for name in periods]))

    async def quota_used(self, period: str) -> int:
        return self._transaction(lambda db: _quota_used(db, self.id, period)) if self.path.exists() else 0

    async def look(self) -> Slot:
        if not self.path.exists():
            return State().slot(time.time(), None, 0, 0, 0)
        return await self.reserve(0.0, start=False)


def _matching(**columns: str | None) -> tuple[str, tuple[str, ...]]:
    """A SQL condition matching the columns given (None matches any), and its arguments."""
    given = {name: value for name, value in columns.items() if value is not None}
    where = " AND ".join(f"{name}=?" for name in given) or "1=1"
    return where, tuple(given.values())


def _set_up(db: sqlite3.Connection) -> None:
    """WAL, and the tables (a file from an earlier version gains its columns), in one transaction."""
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")  # a budget lost in a power cut costs nothing
    db.execute("BEGIN IMMEDIATE")
    try:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        columns = {row[1] for row in db.execute("PRAGMA table_info(budgets)")}
        for column, kind in _COLUMNS.items():
            if column not in columns:
                db.execute(f"ALTER TABLE budgets ADD COLUMN {column} {kind}")
        db.execute("INSERT OR IGNORE INTO meta VALUES ('epoch', ?)", (os.urandom(8).hex(),))
        db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _epoch(db: sqlite3.Connection) -> str:
    row = db.execute("SELECT value FROM meta WHERE name='epoch'").fetchone()
    return str(row[0]) if row else ""


def _entries(db: sqlite3.Connection, where: str, args: tuple[str, ...]) -> list[Remembered]:
    rows = db.execute(
        f"SELECT key_hash, service, name, value, at FROM remembered WHERE {where} AND at >= ? "
        "ORDER BY service, key_hash, name",
        (*args, time.time() - RECORD_SECONDS),
    ).fetchall()
    return [Remembered(*row) for row in rows]


_GIVE_BACK = "UPDATE quota_counts SET used = MAX(0, used - 1) WHERE id=? AND period=?"


def _quota_used(db: sqlite3.Connection, key_id: str, period: str) -> int:
    row = db.execute("SELECT used FROM quota_counts WHERE id=? AND period=?", (key_id, period)).fetchone()
    return int(row[0]) if row else 0


def _quota_claim(
    db: sqlite3.Connection, key_id: str, periods: Sequence[tuple[str, float]], limit: int | None
) -> int | None:
    """One more request counted in each of ``periods`` (each kept its seconds) unless the first holds
    ``limit`` (None)."""
    used = _quota_used(db, key_id, periods[0][0])
    if limit is not None and used >= limit:
        return None
    now = time.time()
    db.executemany(
        "INSERT INTO quota_counts VALUES (?, ?, 1, ?) ON CONFLICT (id, period) DO UPDATE SET used = used + 1",
        [(key_id, name, now + keep) for name, keep in periods],
    )
    db.execute("DELETE FROM quota_counts WHERE expires < ?", (now,))
    return used + 1
