"""A key's budget in a SQLite file (``SQLiteFile``): its schema (made or brought up to date as it
opens), its connection, its transactions, and the entries remembered of each key there.

Its transactions run on a thread of the file's own (one per file in a process), never on the event
loop: a file locked for long or on a full disk is an outage the run waits for (``outage.Outage``,
up to its ``budget_wait``) while the loop goes on (claims renewed, answers read).
"""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from ...service.errors import BudgetError
from .exchange import RECORD_SECONDS, SETTING, Budget, BudgetUnreachable, Remembered

__all__ = ["SQLiteFile", "SCHEMA_VERSION"]

T = TypeVar("T")
_SET_UP_ATTEMPTS = 10  # a new file opened by several processes at once: tries to switch it to WAL
BUSY_SECONDS = 5.0  # a file locked this long is an outage (waited out, said in a line), not a stall
# What SQLite says of a file it cannot use for now: locked (busy) by another process, a full disk,
# an I/O error (a remount, a network disk gone for a moment). Waited out; anything else is an error.
_WAITABLE = {
    5: "locked",
    6: "locked",
    13: "on a full disk",
    10: "failing (I/O errors)",
}  # SQLITE_BUSY, _LOCKED, _FULL, _IOERR
_WAITABLE_WORDS = {"locked": "locked", "disk is full": "on a full disk", "disk i/o error": "failing (I/O errors)"}
_THREADS: dict[Path, ThreadPoolExecutor] = {}
_THREADS_LOCK = threading.Lock()


def _thread_of(path: Path) -> ThreadPoolExecutor:
    """The thread every transaction on the file ``path`` runs on, in this process."""
    with _THREADS_LOCK:
        thread = _THREADS.get(path)
        if thread is None:
            thread = _THREADS[path] = ThreadPoolExecutor(1, thread_name_prefix="batchsum-budget")
        return thread


def _waitable(exc: sqlite3.Error) -> str | None:
    """What the outage line says of ``exc`` when it is one to wait out (None: an error)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and (code & 0xFF) in _WAITABLE:
        return _WAITABLE[code & 0xFF]
    said = str(exc).lower()
    return next((state for words, state in _WAITABLE_WORDS.items() if words in said), None)


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
CREATE TABLE IF NOT EXISTS quota_restored (
    id TEXT NOT NULL, epoch TEXT NOT NULL, period TEXT NOT NULL, used INTEGER NOT NULL, expires REAL NOT NULL,
    PRIMARY KEY (id, epoch, period)
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
# 3: the epoch, the runs' registry and a job's stops; 4: the quotas' restores (tables made in older files
# as they open); 5: the live lane (``gcra.State``: the live start held, the lane's schedule, until when open, the far batch runs' queue)
SCHEMA_VERSION = "5"
_COLUMNS = {  # added to old files
    "last": "REAL NOT NULL DEFAULT 0",
    "pace_at": "REAL NOT NULL DEFAULT 0",
    "held": "REAL NOT NULL DEFAULT 0",
    "live_next": "REAL NOT NULL DEFAULT 0",
    "live_until": "REAL NOT NULL DEFAULT 0",
    "promised": "REAL NOT NULL DEFAULT 0",
    "promisee": "TEXT NOT NULL DEFAULT ''",
}


class SQLiteFile(Budget):
    """A budget's SQLite file: its connection, its transactions (``BEGIN IMMEDIATE``), and the
    entries remembered of each key there."""

    def __init__(self, path: str | os.PathLike[str], key_id: str, *, default: bool = False) -> None:
        self.path = Path(path)
        self.id = key_id
        self.where = f"this machine ({self.path})" if default else f"the file {self.path}"
        self._default = default
        self._db: sqlite3.Connection | None = None
        self._file: tuple[int, int] | None = None  # the device and inode the connection has open
        self._lock = threading.Lock()

    def _fail(self, problem: object) -> BudgetError:
        which = "the machine-wide rate budget" if self._default else "the rate budget"
        return BudgetError(
            f"cannot use {which} at {self.path}: {problem}; set {SETTING} to sqlite:///A/WRITABLE/FILE, "
            "redis://HOST:PORT/DB, or none"
        )

    def _connect(self) -> sqlite3.Connection:
        if self._db is not None:
            if self._file == _identity(self.path):
                return self._db
            # The file was removed (and maybe made again by another process): the connection holds
            # the old one, which nobody else sees. The budget came back empty: open the new one.
            self._db.close()
            self._db = None
        try:
            if self._default:  # the cache folder; a folder the user named must exist (a typo makes none)
                self.path.parent.mkdir(parents=True, exist_ok=True)
            elif not self.path.parent.is_dir():
                raise FileNotFoundError(errno.ENOENT, f"its folder {self.path.parent} does not exist")
            db = sqlite3.connect(self.path, timeout=BUSY_SECONDS, isolation_level=None, check_same_thread=False)
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
                    raise self._error(exc) from None
                time.sleep(0.02 * (attempt + 1))
            except sqlite3.Error as exc:
                db.close()
                raise self._error(exc) from None
        self._db, self._file = db, _identity(self.path)
        self.epoch = _epoch(db)
        return db

    async def _transaction(self, step: Callable[[sqlite3.Connection], T]) -> T:
        """``step`` in one ``BEGIN IMMEDIATE`` transaction on the file's thread, through the budget's
        outage (a file locked or on a full disk is waited for); a ``BudgetError`` naming the file if
        it fails otherwise."""
        return await self.outage.through(lambda: self._on_thread(step))

    async def _on_thread(self, step: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(_thread_of(self.path), self._step_now, step)

    def _step_now(self, step: Callable[[sqlite3.Connection], T]) -> T:
        """``step`` in one transaction, here and now (on the file's thread)."""
        with self._lock:
            db = self._connect()
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    result = step(db)
                    db.execute("COMMIT")
                    return result
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._error(exc) from None

    def _error(self, exc: sqlite3.Error) -> BudgetError:
        """What ``exc`` means: an outage to wait for (locked, a full disk), or an error naming the file."""
        state = _waitable(exc)
        if state is None:
            return self._fail(exc)
        advice = f"free the disk or the file's lock, or set {SETTING} to another file or none"
        return BudgetUnreachable(str(self._fail(exc)), state, str(exc), advice)

    async def recall(self, key_hash: str, service: str) -> list[Remembered]:
        if not self.path.exists():  # a dry run creates nothing
            return []

        def read(db: sqlite3.Connection) -> list[Remembered]:
            db.execute("INSERT OR REPLACE INTO names VALUES (?, ?, ?)", (self.id, key_hash, service))
            return _entries(db, "key_hash=? AND service=?", (key_hash, service))

        return await self._transaction(read)

    async def remember(self, key_hash: str, service: str, entries: dict[str, str]) -> None:
        now = time.time()

        def write(db: sqlite3.Connection) -> None:
            db.executemany(
                "INSERT OR REPLACE INTO remembered VALUES (?, ?, ?, ?, ?)",
                [(key_hash, service, name, value, now) for name, value in entries.items()],
            )
            db.execute("DELETE FROM remembered WHERE at < ?", (now - RECORD_SECONDS,))

        await self._transaction(write)

    async def rewrite(self, entries: Sequence[Remembered]) -> None:
        def write(db: sqlite3.Connection) -> None:
            db.executemany(
                "INSERT INTO remembered VALUES (?, ?, ?, ?, ?) ON CONFLICT (key_hash, service, name) DO UPDATE SET "
                "value = excluded.value, at = excluded.at WHERE excluded.at > remembered.at",
                [(e.key_hash, e.service, e.name, e.value, e.at) for e in entries],
            )
            db.executemany(
                "INSERT OR REPLACE INTO names VALUES (?, ?, ?)", {(self.id, e.key_hash, e.service) for e in entries}
            )

        await self._transaction(write)

    async def remembered(self) -> list[Remembered]:
        if not self.path.exists():
            return []
        return await self._transaction(lambda db: _entries(db, "1=1", ()))

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

        return await self._transaction(delete)

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


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at ``path`` (its device and inode; None: there is none)."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


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
