"""Keeping the machine's answer store (``MachineUpkeep``): its retention (90 days unless set) and size
cap (1 GiB unless set) pruned in small transactions on a thread of its own, at most once an hour
whoever opens it, so pruning never holds a run up for more than a moment; the per-key stores of
earlier versions (``answers-<key>.sqlite`` beside it) taken in the first time it is opened; what
``batchsum store`` shows and removes."""

from __future__ import annotations

import contextlib
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .journal_file import problem
from .store_file import connect_store, where_file, writable
from .stores import REFUSAL_SECONDS, StoreError

__all__ = [
    "MachineUpkeep",
    "take_in_old",
    "keep_up",
    "DEFAULT_RETENTION_DAYS",
    "DEFAULT_MAX_BYTES",
    "PRUNE_EVERY",
    "PRUNE_ROWS",
]

log = logging.getLogger("batchsum")

DEFAULT_RETENTION_DAYS = 90
DEFAULT_MAX_BYTES = 1 << 30
PRUNE_EVERY = 3600.0  # seconds between two prunings of one store (any process)
PRUNE_ROWS = 500  # rows per transaction: a run waits at most that long to write
_PRUNE_BUSY = 1.0  # seconds pruning waits for the file; busier, it leaves the rest for later
_VACUUM_PAGES = 256


class MachineUpkeep:
    """The upkeep of the store file at ``path``, through a connection of its own (``StoreError``
    when it cannot be opened), or through ``db``, a store's that it borrows (left open by ``close``).
    What ``batchsum store`` asks of it (``settings``, ``configure``, ``inventory``, ``remove``)
    raises ``StoreError`` when the file refuses."""

    def __init__(self, path: str | Path, *, readonly: bool = False, db: sqlite3.Connection | None = None) -> None:
        self.path = Path(path)
        self.where = where_file(self.path)
        self._borrowed = db is not None
        readonly = readonly or not writable(self.path)  # a store this user cannot write: shown, never changed
        self._db = db if db is not None else connect_store(self.path, readonly=readonly)

    @contextlib.contextmanager
    def _said(self) -> Iterator[None]:
        """SQLite's errors (a damaged file, a disk that refuses) as ``StoreError``, in one line."""
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"the answer store {self.path}: {exc}") from None

    def _meta(self, name: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE name=?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def settings(self) -> dict[str, Any]:
        """The retention (days), the size cap and the size now (bytes)."""
        with self._said():
            retention = self._meta("retention_days")
            cap = self._meta("max_bytes")
            return {
                "retention_days": int(retention) if retention is not None else DEFAULT_RETENTION_DAYS,
                "max_bytes": int(cap) if cap is not None else DEFAULT_MAX_BYTES,
                "bytes": self.size(),
            }

    def configure(self, *, retention_days: int | None = None, max_bytes: int | None = None) -> None:
        """Set the retention and the size cap, for every process using the store."""
        with self._said():
            for name, value in (("retention_days", retention_days), ("max_bytes", max_bytes)):
                if value is not None:
                    self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, str(value)))
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('pruned_at', '0')")  # pruned at the next open

    def size(self) -> int:
        """The bytes its answers take (the file's pages in use)."""
        (pages,) = self._db.execute("PRAGMA page_count").fetchone()
        (free,) = self._db.execute("PRAGMA freelist_count").fetchone()
        (page,) = self._db.execute("PRAGMA page_size").fetchone()
        return int((pages - free) * page)

    def inventory(self) -> list[tuple[str, float]]:
        """Every answer's service and when it was written."""
        with self._said():
            return [(s, float(w)) for s, w in self._db.execute("SELECT service, written FROM answers").fetchall()]

    def remove(self, *, before: float | None = None, service: str | None = None) -> int:
        """The answers written before ``before`` and of ``service`` (None: any) removed, in small
        transactions, and jobs' refusals with them; how many answers."""
        where = " AND ".join(
            clause for clause, value in (("written < ?", before), ("service = ?", service)) if value is not None
        )
        args = tuple(value for value in (before, service) if value is not None)
        with self._said():
            gone = self._delete(f"WHERE {where}" if where else "", args, busy=30.0)
            self._db.execute(f"DELETE FROM refusals {f'WHERE {where}' if where else ''}", args)  # jobs' own, a day's
        return gone

    def _delete(self, where: str, args: tuple[Any, ...], *, busy: float, order: str = "", limit: int = 0) -> int:
        """Delete the rows ``where`` selects (at most ``limit``; 0: all), ``PRUNE_ROWS`` a transaction."""
        self._db.execute(f"PRAGMA busy_timeout={int(busy * 1000)}")
        gone = 0
        while not limit or gone < limit:
            step = PRUNE_ROWS if not limit else min(PRUNE_ROWS, limit - gone)
            cursor = self._db.execute(
                f"DELETE FROM answers WHERE rowid IN (SELECT rowid FROM answers {where} {order} LIMIT {step})", args
            )
            gone += cursor.rowcount
            if cursor.rowcount < step:
                break
        for _ in range(1 << 16):  # the pages freed back to the disk, in small steps
            if self._db.execute("PRAGMA freelist_count").fetchone()[0] == 0:
                break
            self._db.execute(f"PRAGMA incremental_vacuum({_VACUUM_PAGES})").fetchall()
        return gone

    def due(self, now: float) -> bool:
        """Is pruning due (none within ``PRUNE_EVERY``, or the clock was stepped back past it)? Taken
        for this process when it is: one process prunes at a time. Read first: an opening when it is
        not due writes nothing."""
        try:
            pruned = float(self._meta("pruned_at") or "nan")
        except ValueError:
            pruned = math.nan
        if now - PRUNE_EVERY <= pruned <= now + PRUNE_EVERY:
            return False
        cursor = self._db.execute(
            "UPDATE meta SET value=? WHERE name='pruned_at' AND (CAST(value AS REAL) < ? OR CAST(value AS REAL) > ?)",
            (str(now), now - PRUNE_EVERY, now + PRUNE_EVERY),
        )
        if cursor.rowcount:
            return True
        cursor = self._db.execute("INSERT OR IGNORE INTO meta VALUES ('pruned_at', ?)", (str(now),))
        return cursor.rowcount == 1

    def prune(self, now: float | None = None) -> int:
        """Answers past the retention removed, then the oldest while over the size cap; lapsed
        claims of holders long gone, and jobs' refusals past their day, too. How many answers went."""
        now = time.time() if now is None else now
        settings = self.settings()
        gone = self._delete("WHERE written < ?", (now - settings["retention_days"] * 86400,), busy=_PRUNE_BUSY)
        while (size := self.size()) > settings["max_bytes"]:  # the oldest go first, down to 90% of the cap
            count = self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]
            step = max(1, int(count * (size - settings["max_bytes"] * 0.9) / size))
            removed = self._delete("", (), busy=_PRUNE_BUSY, order="ORDER BY written", limit=step)
            if not removed:
                break
            gone += removed
        self._db.execute("DELETE FROM claims WHERE expires < ?", (now - 86400,))
        self._db.execute("DELETE FROM refusals WHERE written < ?", (now - REFUSAL_SECONDS,))
        return gone

    def close(self) -> None:
        if not self._borrowed:
            self._db.close()


def take_in_old(db: sqlite3.Connection, path: Path) -> int:
    """The summaries of the per-key stores of earlier versions (``answers-*.sqlite`` beside the store
    at ``path``), taken into it through ``db`` once (a marker in ``meta`` says so); how many."""
    if db.execute("SELECT 1 FROM meta WHERE name='old_stores'").fetchone() is not None:
        return 0
    taken = 0
    for old in sorted(path.parent.glob("answers-*.sqlite")):
        if problem(old) is not None:
            continue
        try:
            taken += _take_in(db, old)
        except sqlite3.Error as exc:
            log.warning("batchsum: could not take in the answers of %s: %s", old, exc)
    db.execute("INSERT OR REPLACE INTO meta VALUES ('old_stores', ?)", (str(taken),))
    return taken


def _take_in(db: sqlite3.Connection, old: Path) -> int:
    source = sqlite3.connect(f"file:{old}?mode=ro", uri=True)
    taken = 0
    try:
        rows = source.execute(
            "SELECT service, fingerprint, summary, attempts, finished_at FROM answers "
            "WHERE status = 'ok' AND summary IS NOT NULL AND service IS NOT NULL"
        )
        while chunk := rows.fetchmany(PRUNE_ROWS):
            entries = [(s, key.removeprefix(f"{s} "), summary, a, w) for s, key, summary, a, w in chunk]
            db.execute("BEGIN IMMEDIATE")
            try:
                taken += db.executemany(
                    "INSERT OR IGNORE INTO answers (service, scope, fingerprint, summary, attempts, written) "
                    "VALUES (?, '', ?, ?, ?, ?)",
                    entries,
                ).rowcount
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
    finally:
        source.close()
    return taken


def keep_up(path: Path, db: sqlite3.Connection) -> None:
    """At a store's opening, on its connection ``db`` (before the store is used): the old stores
    taken in (once, before anything is looked up), and when pruning is due (at most once an hour,
    whoever opens the store), pruning started on a thread with a connection of its own."""
    try:
        taken = take_in_old(db, path)
        if taken:
            log.info("batchsum: %d answers of earlier versions' stores taken into %s", taken, path)
        if not MachineUpkeep(path, db=db).due(time.time()):
            return
        pruner = MachineUpkeep(path)
    except (sqlite3.Error, StoreError):
        return  # the next opening tries again
    threading.Thread(target=_prune, args=(pruner,), name="batchsum-store-prune", daemon=True).start()


def _prune(upkeep: MachineUpkeep) -> None:
    try:
        upkeep.prune()
    except sqlite3.Error as exc:  # busy, or the disk is full: the next opening tries again
        log.info("batchsum: pruning the answer store %s stopped: %s", upkeep.path, exc)
    finally:
        upkeep.close()
