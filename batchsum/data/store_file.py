"""The machine's answer store's file: its format and schema (2: answers by service, scope and
fingerprint), made exclusively with mode 0600, opened (read-only when this user cannot write it:
``open_readonly``), set up, checked, and a format-1 file migrated in place."""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
import time
from pathlib import Path
from urllib.parse import quote

from ..service.location import STORE, machine_file
from .leases import SQLiteClaims
from .stores import StoreError

__all__ = [
    "FORMAT",
    "FORMATS",
    "SCHEMA",
    "REFUSALS",
    "default_store_path",
    "where_file",
    "writable",
    "open_readonly",
    "open_to_read",
    "connect_store",
    "store_format",
    "said",
]

FORMAT = "batchsum-store-2"  # 2: answers by (service, scope, fingerprint); 1 had no scope
FORMATS = {"batchsum-store-1": 1, FORMAT: 2}  # what a read-only opening reads
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

_ANSWERS = """CREATE TABLE IF NOT EXISTS answers (
    service TEXT NOT NULL,
    scope TEXT NOT NULL DEFAULT '',
    fingerprint TEXT NOT NULL,
    summary TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    written REAL NOT NULL,
    PRIMARY KEY (service, scope, fingerprint)
)"""
_BY_AGE = "CREATE INDEX IF NOT EXISTS answers_by_age ON answers (written)"

SCHEMA = f"""
{_ANSWERS};
{_BY_AGE};
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('format', '{FORMAT}');
{REFUSALS}"""


def default_store_path() -> Path:
    """``answers.sqlite`` in the user's cache folder (``platformdirs``; honours ``$XDG_CACHE_HOME``),
    beside the machine's rate budget."""
    return machine_file(STORE)


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


def writable(path: Path) -> bool:
    """Can this user write the store at ``path`` (the file, and its folder, where SQLite makes the
    ``-wal`` and ``-shm`` files)? A file not made yet is to be made (``_create`` says why it cannot)."""
    if not path.exists():
        return True
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)


def open_readonly(path: Path) -> tuple[sqlite3.Connection, bool]:
    """The store at ``path`` opened only to read, and whether as ``immutable`` (see the module
    docstring). Raises ``sqlite3.Error``."""
    uri = "file:" + quote(str(path))
    db = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=30, isolation_level=None, check_same_thread=False)
    try:
        db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return db, False
    except sqlite3.OperationalError as exc:
        db.close()
        if "unable to open" not in str(exc) or os.path.exists(f"{path}-wal"):
            raise
    # No -shm and none can be made: nobody has the file open to write. Read it as it is, until a
    # writer appears (``MachineStore._use`` looks for its -wal before every read).
    db = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, isolation_level=None, check_same_thread=False)
    return db, True


def open_to_read(path: Path) -> tuple[sqlite3.Connection, bool]:
    """``open_readonly``, the file checked to be a store of a format this batchsum reads (``StoreError``
    when it is not, or cannot be opened)."""
    try:
        db, immutable = open_readonly(path)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"the answer store {path} cannot be opened: {exc}") from None
    try:
        store_format(db)
    except sqlite3.Error as exc:
        db.close()
        raise said(path, exc) from None
    return db, immutable


def connect_store(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """The store at ``path``, made when missing (not ``readonly``), set up and checked (a store of an
    earlier format brought up to date, unless ``readonly``); in autocommit, WAL mode,
    ``synchronous=NORMAL``. ``StoreError`` when it cannot be, or is not a store."""
    try:
        if readonly:
            db = open_readonly(path)[0]
        else:
            _create(path)
            db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"the answer store {path} cannot be opened: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        if readonly:
            store_format(db)
        elif _is_set_up(db):  # the usual opening: no write lock taken, nothing made
            db.execute("PRAGMA synchronous=NORMAL")
        else:
            _set_up(db)
    except sqlite3.Error as exc:
        db.close()
        raise said(path, exc) from None
    return db


def said(path: Path, exc: sqlite3.Error) -> StoreError:
    """SQLite's error at a store's opening, in one line saying what to do."""
    why = str(exc)
    if "not a database" in why or "no such table" in why or "not a batchsum" in why:
        return StoreError(f"the answer store {path} is not a batchsum answer store; it was left as it is")
    if why.startswith("of an unknown format"):
        return StoreError(f"the answer store {path} is {why}; it was left as it is")
    if "malformed" in why:  # damaged: nothing reads it again; what it held was paid for once
        why += "; move the file aside and the next run starts a new store (only the answers in it are lost)"
    return StoreError(f"the answer store {path} cannot be opened: {why}")


def store_format(db: sqlite3.Connection) -> int:
    """The store's format (1 or 2); ``sqlite3.DatabaseError`` for a format this batchsum cannot read."""
    row = db.execute("SELECT value FROM meta WHERE name='format'").fetchone()
    if row is None or row[0] not in FORMATS:
        raise sqlite3.DatabaseError(f"of an unknown format {row[0] if row else None!r}")
    return FORMATS[row[0]]


_TABLES = {"answers", "meta", "claims", "refusals"}


def _is_set_up(db: sqlite3.Connection) -> bool:
    """Is the file a store made already (its tables there, its format row this version's, in WAL mode
    since it was made)? Then it is opened as it is; anything else goes through ``_set_up``, which says
    what is wrong with it or brings it up to date."""
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
    file together: switching it to WAL can answer "locked" at once, without the busy timeout); a
    store of format 1 migrated in place."""
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
    if store_format(db) == 1:
        _migrate(db)
    if tables and "refusals" not in tables:  # a store of an earlier version
        db.executescript(f"BEGIN IMMEDIATE;{REFUSALS}COMMIT;")
    SQLiteClaims.set_up(db)


def _migrate(db: sqlite3.Connection) -> None:
    """A format-1 store (answers by service and fingerprint) brought to format 2 in one transaction:
    the scope added to the answers' primary key, every answer kept with the scope ``""`` (every key of
    its service, as before). Whoever opens it first migrates it; the others find it done."""
    db.execute("BEGIN IMMEDIATE")
    try:
        if store_format(db) == 1:
            db.execute("ALTER TABLE answers RENAME TO answers_1")
            db.execute("DROP INDEX IF EXISTS answers_by_age")
            db.execute(_ANSWERS)
            db.execute(
                "INSERT INTO answers (service, scope, fingerprint, summary, attempts, written) "
                "SELECT service, '', fingerprint, summary, attempts, written FROM answers_1"
            )
            db.execute("DROP TABLE answers_1")
            db.execute(_BY_AGE)
            db.execute("UPDATE meta SET value=? WHERE name='format'", (FORMAT,))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
