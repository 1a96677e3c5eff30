"""``MachineStore``: the answer store every run of this user on this machine shares, a SQLite file in
the user's cache folder (``answers.sqlite``, mode 0600), or any file ``store="sqlite:///PATH"`` names.

An answer is kept by what makes it: the service (``contract.service_identity``) and the request's
fingerprint (``engine.fingerprints``); never by a key, an output or a run. Only summaries are shared
(a refusal stays in the output's journal); a job with no journal, whose workers share the store as
their only scope, keeps its refusals there too, for itself alone (by its ``job``) and for a day
(``REFUSAL_SECONDS``). Many processes use the file at once (WAL, a busy timeout),
with the claims and leases of ``leases``, so two jobs starting together pay once. Its upkeep (the
retention and the size cap, pruned in small transactions on a thread of its own; the old per-key
stores imported when it is first opened; entries listed and removed) is in ``store_upkeep``.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from .leases import SQLiteClaims
from .results import OK, Answer
from .stores import LOOKUP_CHUNK, REFUSAL_SECONDS, StoreError

__all__ = ["MachineStore", "FORMAT", "SCHEMA", "REFUSALS", "default_store_path", "connect_store"]

FORMAT = "batchsum-store-1"
_SET_UP_ATTEMPTS = 20  # a new file opened by several processes at once: tries to switch it to WAL

# A job's refusals (a shared run with no journal: the store is its only scope), seen by that job
# alone and for a day. Made in a store of an earlier version when it is first opened.
REFUSALS = """
CREATE TABLE IF NOT EXISTS refusals (
    job TEXT NOT NULL,
    service TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    answer TEXT NOT NULL,
    written REAL NOT NULL,
    PRIMARY KEY (job, service, fingerprint)
);
CREATE INDEX IF NOT EXISTS refusals_by_age ON refusals (written);
"""

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS answers (
    service TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    summary TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    written REAL NOT NULL,
    PRIMARY KEY (service, fingerprint)
);
CREATE INDEX IF NOT EXISTS answers_by_age ON answers (written);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('format', '{FORMAT}');
{REFUSALS}"""


_PUT = "INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?, ?)"
_PUT_REFUSAL = "INSERT OR REPLACE INTO refusals VALUES (?, ?, ?, ?, ?)"


def default_store_path() -> Path:
    """``answers.sqlite`` in the user's cache folder (``platformdirs``; honours ``$XDG_CACHE_HOME``),
    beside the machine's rate budget."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("batchsum", appauthor=False)) / "answers.sqlite"


def where_file(path: Path) -> str:
    """How messages name the store file at ``path``: ``this machine (PATH)`` for the machine's own
    store, ``the file PATH`` for one a user named (``--store sqlite:///PATH``)."""
    try:
        own = path.resolve() == default_store_path().resolve()
    except OSError:
        own = False
    return f"this machine ({path})" if own else f"the file {path}"


def _create(path: Path) -> None:
    """The file, made exclusively with mode 0600 (never through a link planted at its name) unless
    another process made it first; a file of the user's own that others may read is made 0600. The
    machine store's folder (the user's cache folder) is made when missing; a folder the user named
    must exist (a mistyped path makes no folders)."""
    if path.parent.resolve() == default_store_path().parent.resolve():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    elif not path.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, f"its folder {path.parent} does not exist")
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        os.close(os.open(path, flags, 0o600))
    except FileExistsError:  # made by another process, or earlier: the user's own stays theirs alone
        found = os.lstat(path)
        if stat.S_ISREG(found.st_mode) and found.st_uid == os.getuid() and found.st_mode & 0o077:
            os.chmod(path, 0o600)


def connect_store(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """The store at ``path``, made when missing (not ``readonly``), set up and checked; in autocommit,
    WAL mode, ``synchronous=NORMAL``. ``StoreError`` when it cannot be, or is not a store."""
    try:
        if readonly:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30, isolation_level=None)
        else:
            _create(path)
            db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"the answer store {path} cannot be opened: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        if readonly:
            row = db.execute("SELECT value FROM meta WHERE name='format'").fetchone()
            if row is None or row[0] != FORMAT:
                raise sqlite3.DatabaseError(f"of an unknown format {row[0] if row else None!r}")
        elif _is_set_up(db):  # the usual opening: no write lock taken, nothing made
            db.execute("PRAGMA synchronous=NORMAL")
        else:
            _set_up(db)
    except sqlite3.Error as exc:
        db.close()
        why = str(exc)
        if "not a database" in why or "no such table" in why or "not a batchsum" in why:
            raise StoreError(f"the answer store {path} is not a batchsum answer store; it was left as it is") from None
        if why.startswith("of an unknown format"):
            raise StoreError(f"the answer store {path} is {why}; it was left as it is") from None
        if "malformed" in why:  # damaged: nothing reads it again; what it held was paid for once
            why += "; move the file aside and the next run starts a new store (only the answers in it are lost)"
        raise StoreError(f"the answer store {path} cannot be opened: {why}") from None
    return db


_TABLES = {"answers", "meta", "claims", "refusals"}


def _is_set_up(db: sqlite3.Connection) -> bool:
    """Is the file a store made already (its tables there, its format row ours, in WAL mode since
    it was made)? Then it is opened as it is; anything else goes through ``_set_up``, which says
    what is wrong with it."""
    try:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not _TABLES <= tables:
            return False
        row = db.execute("SELECT value FROM meta WHERE name='format'").fetchone()
    except sqlite3.Error:
        return False
    return row is not None and row[0] == FORMAT


def _set_up(db: sqlite3.Connection) -> None:
    """The file checked (a store, or empty: never another program's database, which is left as it
    was), then WAL mode and the schema, made once whoever opens it first (processes opening a new
    file together: switching it to WAL can answer "locked" at once, without the busy timeout)."""
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if tables and not {"meta", "answers"} <= tables:
        raise sqlite3.DatabaseError("not a batchsum answer store")
    db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # a new file's: pruned pages go back to the disk in steps
    for attempt in range(_SET_UP_ATTEMPTS):
        try:
            db.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == _SET_UP_ATTEMPTS - 1:
                raise
            time.sleep(0.02 * (attempt + 1))
    db.execute("PRAGMA synchronous=NORMAL")
    if not tables:
        db.executescript(f"BEGIN IMMEDIATE;{SCHEMA}COMMIT;")
    row = db.execute("SELECT value FROM meta WHERE name='format'").fetchone()
    if row is None or row[0] != FORMAT:
        raise sqlite3.DatabaseError(f"of an unknown format {row[0] if row else None!r}")
    if tables and "refusals" not in tables:  # a store of an earlier version
        db.executescript(f"BEGIN IMMEDIATE;{REFUSALS}COMMIT;")
    SQLiteClaims.set_up(db)


class MachineStore:
    """The answers of ``service`` in the store file at ``path`` (``default_store_path()``), and this
    run's claims there. ``get_many``, ``put``, ``claim``, ``release``, ``renew``, ``close``: the
    shared store a run uses (``scopes.Scopes``); ``readonly``: only to look; ``job``: the job whose
    refusals it keeps too (see the module docstring; None: summaries only). ``StoreError`` when it
    cannot be opened or used."""

    claims = True

    def __init__(
        self, path: str | os.PathLike[str], service: str, *, readonly: bool = False, job: str | None = None
    ) -> None:
        self.path = Path(path)
        self.service = service
        self.job = job
        self.where = where_file(self.path)
        self._lock = threading.RLock()
        self._db = connect_store(self.path, readonly=readonly)  # readonly: to look (a dry run), never to write
        self._claims = SQLiteClaims(self._db, self._lock)

    @property
    def connection(self) -> sqlite3.Connection:
        """Its connection: the store's upkeep uses it when the store opens (``store_upkeep.keep_up``),
        before the store is used, so that opening it takes one connection."""
        return self._db

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        try:
            with self._lock:
                return self._db.execute(sql, args)
        except sqlite3.Error as exc:
            raise StoreError(f"the answer store {self.path}: {exc}") from None

    def get(self, key: str) -> Answer | None:
        return self.get_many([key]).get(key)

    def get_many(self, keys: list[str], since: float | None = None) -> dict[str, Answer]:
        """The answers kept for ``keys`` (fingerprints), and the job's refusals of the last day for
        the others: one query each per ``LOOKUP_CHUNK`` keys. ``since``: only those written since
        then (``time.time()``: a refreshing run's own, or another's while it ran)."""
        found: dict[str, Answer] = {}
        oldest = -math.inf if since is None else since
        recent = "" if since is None else " AND written>=?"  # by the primary key either way
        for start in range(0, len(keys), LOOKUP_CHUNK):
            chunk = keys[start : start + LOOKUP_CHUNK]
            rows = self._run(
                "SELECT fingerprint, summary, attempts FROM answers WHERE service=? AND fingerprint IN "
                f"({','.join('?' * len(chunk))}){recent}",
                (self.service, *chunk, *(() if since is None else (since,))),
            ).fetchall()
            for key, summary, attempts in rows:
                found[key] = Answer(summary, OK, None, None, 200, attempts)
            rest = [key for key in chunk if key not in found]
            if self.job is not None and rest:
                refused = self._run(
                    "SELECT fingerprint, answer FROM refusals WHERE job=? AND service=? AND written>=? AND "
                    f"fingerprint IN ({','.join('?' * len(rest))})",
                    (self.job, self.service, max(oldest, time.time() - REFUSAL_SECONDS), *rest),
                ).fetchall()
                for key, answer in refused:
                    found[key] = Answer(*json.loads(answer))
        return found

    def put(self, key: str, answer: Answer) -> None:
        """Keep ``answer``: a summary for every job (it replaces what was kept: ``refresh``); a
        refusal for this store's ``job`` alone, for a day (no job: not kept, it stays in the output's
        journal)."""
        row: tuple[Any, ...]
        if answer.status == OK and answer.summary is not None:
            sql, row = _PUT, (self.service, key, answer.summary, answer.attempts, time.time())
        elif self.job is not None:
            sql, row = _PUT_REFUSAL, (self.job, self.service, key, json.dumps(list(answer)), time.time())
        else:
            return
        claimed = self._claim_key(key)
        try:
            with self._lock:
                if claimed not in self._claims.held:
                    self._db.execute(sql, row)
                    return
                self._db.execute("BEGIN IMMEDIATE")  # the answer kept and its claim let go: one commit
                try:
                    self._db.execute(sql, row)
                    self._claims.release_here(claimed)
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._claims.held.discard(claimed)
        except sqlite3.Error as exc:
            raise StoreError(f"the answer store {self.path}: {exc}") from None

    def _claim_key(self, key: str) -> str:
        return f"{self.service} {key}"

    def claim(self, key: str) -> bool:
        try:
            return self._claims.claim(self._claim_key(key))
        except sqlite3.Error as exc:
            raise StoreError(f"the answer store {self.path}: {exc}") from None

    def release(self, key: str) -> None:
        try:
            self._claims.release(self._claim_key(key))
        except sqlite3.Error as exc:
            raise StoreError(f"the answer store {self.path}: {exc}") from None

    def renew(self, keys: Collection[str]) -> None:
        """The claims this run holds, renewed (``SQLiteClaims.renew``: the ones it knows it holds,
        which ``keys`` are)."""
        try:
            self._claims.renew()
        except sqlite3.Error as exc:
            raise StoreError(f"the answer store {self.path}: {exc}") from None

    def __len__(self) -> int:
        return int(self._run("SELECT COUNT(*) FROM answers WHERE service=?", (self.service,)).fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __repr__(self) -> str:
        return f"MachineStore({str(self.path)!r})"
