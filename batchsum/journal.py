"""The SQLite journal: finished answers by request fingerprint, kept across runs and crashes.

Each answer is committed as it arrives. In WAL mode with ``synchronous=NORMAL`` a commit is one
append to the write-ahead log, with no fsync: a killed process (SIGKILL, Ctrl-C, a crash) loses
nothing, because the data is already with the operating system; the log is synced at checkpoints,
so a power cut loses at most the last few seconds the OS had not written back, and SQLite never
leaves a corrupt file. Only answers worth keeping are written (summaries and 422 refusals);
transient failures are tried again on the next run.
"""

from __future__ import annotations

import os
import sqlite3
import time
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

    def __init__(self, path: str | os.PathLike[str]) -> None:
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

    def get(self, key: str) -> Answer | None:
        row = self._db.execute(
            "SELECT summary, status, error, message, http_status, attempts FROM answers WHERE fingerprint=?",
            (key,),
        ).fetchone()
        return Answer(*row) if row else None

    def __contains__(self, key: str) -> bool:
        return self._db.execute("SELECT 1 FROM answers WHERE fingerprint=?", (key,)).fetchone() is not None

    def put(self, key: str, answer: Answer) -> None:
        """Keep ``answer``; committed at once (autocommit)."""
        self._db.execute(
            "INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (key, *answer, time.time()),
        )

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Journal({str(self.path)!r})"
