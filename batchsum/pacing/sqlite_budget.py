"""``SQLiteBudget``: a key's budget shared by every process on this machine, one row per budget in a
SQLite file (the default, ``"machine"``), with the entries remembered of each key.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..service.errors import BudgetError
from .exchange import (
    LOOK,
    NO_REPORT,
    RECORD_SECONDS,
    RESERVE,
    RESERVE_ONLY,
    SETTING,
    Budget,
    Remembered,
    Report,
    Share,
    Slot,
)
from .gcra import KEEP_SECONDS, MINUTE, State, deferred, share_wait

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
CREATE TABLE IF NOT EXISTS quota_counts (
    id TEXT NOT NULL, period TEXT NOT NULL, used INTEGER NOT NULL, expires REAL NOT NULL, PRIMARY KEY (id, period)
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

    async def _call(self, what: int, interval: float, report: Report, share: Share | None) -> Slot:
        return self._transaction(lambda db: self._step(db, what, interval, report, share))

    def _step(self, db: sqlite3.Connection, what: int, interval: float, report: Report, share: Share | None) -> Slot:
        now = time.time()
        row = db.execute(
            "SELECT tat, paused_until, reason, pace, pace_version, last FROM budgets WHERE id=?", (self.id,)
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
        return deferred(state.slot(now, at, int(starts), int(refused), committed), turn)

    async def quota_claim(self, period: str, limit: int, keep: float) -> int | None:
        return self._transaction(lambda db: _quota_claim(db, self.id, period, limit, keep))

    async def quota_give_back(self, period: str) -> None:
        self._transaction(lambda db: db.execute(_GIVE_BACK, (self.id, period)))

    async def quota_used(self, period: str) -> int:
        return self._transaction(lambda db: _quota_used(db, self.id, period)) if self.path.exists() else 0

    async def recall(self, key_hash: str, service: str) -> list[Remembered]:
        if not self.path.exists():
            return []
        return self._transaction(
            lambda db: _entries(db, "key_hash=? AND service=?", (key_hash, service)),
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
        return self._transaction(lambda db: _entries(db, "1=1", ()))

    async def forget(self, key_hash: str | None = None, service: str | None = None, name: str | None = None) -> int:
        if not self.path.exists():
            return 0
        where, args = _matching(key_hash=key_hash, service=service, name=name)
        return self._transaction(lambda db: db.execute(f"DELETE FROM remembered WHERE {where}", args).rowcount)

    async def look(self) -> Slot:
        if not self.path.exists():
            return State().slot(time.time(), None, 0, 0)
        return await self.reserve(0.0, start=False)

    async def aclose(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def _matching(**columns: str | None) -> tuple[str, tuple[str, ...]]:
    """A SQL condition matching the columns given (None matches any), and its arguments."""
    given = {name: value for name, value in columns.items() if value is not None}
    where = " AND ".join(f"{name}=?" for name in given) or "1=1"
    return where, tuple(given.values())


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


def _quota_claim(db: sqlite3.Connection, key_id: str, period: str, limit: int, keep: float) -> int | None:
    """One more request counted in ``period`` unless ``limit`` are (None); kept ``keep`` seconds."""
    used = _quota_used(db, key_id, period)
    if used >= limit:
        return None
    db.execute(
        "INSERT OR REPLACE INTO quota_counts VALUES (?, ?, ?, ?)", (key_id, period, used + 1, time.time() + keep)
    )
    db.execute("DELETE FROM quota_counts WHERE expires < ?", (time.time(),))
    return used + 1
