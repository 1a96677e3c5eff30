"""A journal's file: its format and schema, checked before it is opened (``problem``), created
exclusively (``create``), opened (``connect``) and brought up to date (``adopt``)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from ..service.errors import InputError, JournalError
from .run_lock import RunLock

__all__ = [
    "FORMAT",
    "CACHE_KIB",
    "COLUMNS",
    "INSERT",
    "SCHEMA",
    "problem",
    "create",
    "connect",
    "insert_all",
    "columns",
    "adopt",
]

FORMAT = "batchsum-journal-1"
CACHE_KIB = 4096  # SQLite's page cache per connection: a bound, whatever the journal's size

COLUMNS = "fingerprint, summary, status, error, message, http_status, attempts, finished_at, service"
INSERT = f"INSERT OR REPLACE INTO answers ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"

SCHEMA = f"""
CREATE TABLE answers (
    fingerprint TEXT PRIMARY KEY,
    summary TEXT,
    status TEXT NOT NULL,
    error TEXT,
    message TEXT,
    http_status INTEGER,
    attempts INTEGER NOT NULL,
    finished_at REAL NOT NULL,
    service TEXT
);
CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('format', '{FORMAT}');
"""


def problem(path: Path) -> str | None:
    """None when ``path`` is a batchsum journal in good order; else why not. Opens it read-only."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return f"cannot be opened ({exc})"
    try:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "meta" not in tables or "answers" not in tables:
            return "is not a batchsum journal (another program's database, or not a database)"
        row = db.execute("SELECT value FROM meta WHERE name='format'").fetchone()
        if row is None or row[0] != FORMAT:
            return f"is a journal of an unknown format {row[0] if row else None!r}"
        (check,) = db.execute("PRAGMA quick_check(1)").fetchone()
        if check != "ok":
            return f"is damaged ({' '.join(check.replace('*', ' ').split())})"
    except sqlite3.DatabaseError as exc:
        return "is not a batchsum journal" if "not a database" in str(exc) else f"is damaged ({exc})"
    finally:
        db.close()
    return None


def create(path: Path) -> None:
    """A new journal at ``path``, created exclusively (never through a link planted at its name), mode
    0600 like the answer store: it holds the output's summaries (its -wal and -shm take its mode)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise InputError(f"the journal {path} appeared while it was being created; run again") from None
    except OSError as exc:
        raise InputError(f"cannot create the journal {path}: {exc.strerror}") from None
    try:
        RunLock.created(path, fd)  # a new inode: the run's lock now holds it too
    finally:
        os.close(fd)
    try:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.executescript(SCHEMA)
        finally:
            db.close()
    except sqlite3.Error as exc:
        path.unlink(missing_ok=True)
        raise InputError(f"cannot create the journal {path}: {exc}") from None


def connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    """The journal at ``path``, opened in autocommit: in WAL mode with ``synchronous=NORMAL`` unless
    ``readonly`` (see ``journal``)."""
    try:
        uri = f"file:{path}?mode=ro" if readonly else f"file:{path}"
        db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        if not readonly:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
    except sqlite3.Error as exc:
        raise InputError(f"cannot open the journal {path}: {exc}") from None
    return db


def insert_all(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Put ``rows`` (``COLUMNS``) in the journal in one transaction: all of them or, raising
    ``sqlite3.Error``, none."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.executemany(INSERT, rows)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def columns(db: sqlite3.Connection) -> list[str]:
    """The columns of the journal's answers."""
    return [row[1] for row in db.execute("PRAGMA table_info(answers)").fetchall()]


def adopt(db: sqlite3.Connection, path: Path, service: str) -> int:
    """Take the answers of a journal written before answers carried their service as ``service``'s:
    the column added where it is missing, each answer stamped, the adoption noted in ``meta``; one
    transaction. How many answers were adopted."""
    try:
        db.execute("BEGIN IMMEDIATE")  # the workers of one job may adopt it at once: one does
        try:
            if "service" not in columns(db):  # looked at again, inside the transaction
                db.execute("ALTER TABLE answers ADD COLUMN service TEXT")
            adopted = db.execute(
                "UPDATE answers SET fingerprint = ? || ' ' || fingerprint, service = ? WHERE service IS NULL",
                (service, service),
            ).rowcount
            db.execute("INSERT OR REPLACE INTO meta VALUES ('adopted_by', ?)", (service,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        raise JournalError(f"the journal {path}: {exc}") from None
    return int(adopted)
