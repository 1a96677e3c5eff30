"""The SQLite journal: finished answers by request fingerprint, kept across runs and crashes.

WAL mode, commits batched every ``commit_seconds`` (or ``commit_rows`` answers): a SIGKILL or a
power cut loses at most those few seconds of answers, and never corrupts the file. Only answers
worth keeping are written (summaries and 422 refusals); transient failures are tried again.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .engine import Answer
from .errors import InputError

__all__ = ["Journal"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS answers (
    fingerprint TEXT PRIMARY KEY,
    summary TEXT,
    status TEXT NOT NULL,
    error TEXT,
    message TEXT,
    http_status INTEGER,
    attempts INTEGER NOT NULL,
    finished_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('format', 'batchsum-journal-1');
"""


class Journal:
    """A SQLite-backed answer store. ``with Journal("run.journal.sqlite") as journal: ...``"""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        commit_seconds: float = 2.0,
        commit_rows: int = 500,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise InputError(f"cannot create the journal {self.path}: folder {self.path.parent} does not exist")
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            (format_,) = self._db.execute("SELECT value FROM meta WHERE name='format'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise InputError(f"{self.path} is not a batchsum journal ({exc}); pass another --journal path") from None
        if format_ != "batchsum-journal-1":
            raise InputError(f"{self.path} is a journal of an unknown format {format_!r}")
        self._commit_seconds = commit_seconds
        self._commit_rows = commit_rows
        self._clock = clock
        self._uncommitted = 0
        self._last_commit = clock()

    def get(self, key: str) -> Answer | None:
        row = self._db.execute(
            "SELECT summary, status, error, message, http_status, attempts FROM answers WHERE fingerprint=?",
            (key,),
        ).fetchone()
        return Answer(*row) if row else None

    def __contains__(self, key: str) -> bool:
        return self._db.execute("SELECT 1 FROM answers WHERE fingerprint=?", (key,)).fetchone() is not None

    def put(self, key: str, answer: Answer) -> None:
        if not self._uncommitted:
            self._db.execute("BEGIN")
        self._db.execute(
            "INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (key, *answer, time.time()),
        )
        self._uncommitted += 1
        if self._uncommitted >= self._commit_rows or self._clock() - self._last_commit >= self._commit_seconds:
            self.flush()

    def flush(self) -> None:
        """Commit what is written so far."""
        if self._uncommitted:
            self._db.execute("COMMIT")
            self._uncommitted = 0
        self._last_commit = self._clock()

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]

    def close(self) -> None:
        self.flush()
        self._db.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Journal({str(self.path)!r})"
