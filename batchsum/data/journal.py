"""The SQLite journal: finished answers by request fingerprint, kept across runs and crashes, held by
one run at a time; and ``RunLock``, the lock a run takes on its journal and its output.

Each answer is committed as it arrives. In WAL mode with ``synchronous=NORMAL`` a commit is one
append to the write-ahead log, with no fsync: a killed process (SIGKILL, Ctrl-C, a crash) loses
nothing, because the data is already with the operating system; the log is synced at checkpoints,
so a power cut loses at most the last few seconds the OS had not written back, and SQLite never
leaves a corrupt file. Only answers worth keeping are written (summaries and permanent refusals);
transient failures are tried again on the next run.

A file that is not a batchsum journal (another program's database, any other file) is refused and
left as it was; a new journal is created exclusively, never through a link planted at its name.

Several runs at once (Dask partitions on several workers) share answers through a ``SharedJournal``
(one machine) or a ``RedisStore`` (many machines): both add claims, so that a request another run is
already sending is awaited, not paid for again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sqlite3
import stat
import sys
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ..service.errors import BudgetError, InputError, JournalError, redact_location
from .results import Answer
from .stores import CLAIM_SECONDS, claim_owner, holder_is_gone

__all__ = ["Journal", "SharedJournal", "RedisStore", "RunLock", "FORMAT"]

FORMAT = "batchsum-journal-1"
LOOKUP_CHUNK = 500  # keys per query of a look-up in bulk (SQLite allows 999 parameters at the least)
CACHE_KIB = 4096  # SQLite's page cache per connection: a bound, whatever the journal's size

_COLUMNS = "fingerprint, summary, status, error, message, http_status, attempts, finished_at, service"
_INSERT = f"INSERT OR REPLACE INTO answers ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"

_SCHEMA = f"""
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


# Every RunLock this process holds, by what it locks: ("path", resolved path) and, while it holds the
# file itself, ("inode", device, inode). A second RunLock here on the same file (the output and the
# journal given as one file under two names) is refused by name instead of waiting on itself.
_held: dict[tuple[Any, ...], RunLock] = {}
_held_guard = threading.Lock()


def _flock_holder(device: int, inode: int) -> str | None:
    """Who holds an ``flock`` on the file (device, inode), from ``/proc/locks`` (Linux); None elsewhere."""
    wanted = f"{os.major(device):02x}:{os.minor(device):02x}:{inode}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            for line in locks:
                fields = line.split()
                # "1: FLOCK ADVISORY WRITE 1234 08:01:5678 0 EOF"; waiters have "->" after the number.
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted:
                    return f"pid {fields[4]} on {socket.gethostname()}"
    except OSError:
        pass
    return None


class RunLock:
    """This process's exclusive hold on the file at ``path`` for a run. The lock follows the file's
    identity, so that every spelling of it (a symlink, ``dir/../name``, a hard link) meets the same lock:

    - its resolved path (``os.path.realpath``), through ``.NAME.lock`` beside the real file: this
      holds while the file does not exist yet, and while it is replaced (an output is renamed into
      place when complete);
    - while the file exists, its inode, through the file itself, which every hard link shares: taken
      at the start when the file is there, and when a ``Journal`` creates it under this lock.

    Both are ``flock`` locks: released when the process ends, however it ends, so a crash leaves no
    stale lock; the lock file is removed when the run is done. ``wait``: wait for the other run
    instead of refusing at once."""

    def __init__(self, path: str | os.PathLike[str], what: str, *, wait: bool = False) -> None:
        self.path = Path(path)
        self.what = what
        self.real = Path(os.path.realpath(self.path))
        self._wait = wait
        self._lock_path = self.real.with_name(f".{self.real.name}.lock")
        self._fd: int | None = None
        self._file_fd: int | None = None
        self._inode: tuple[Any, ...] | None = None  # the inode lock's key in _held, while held
        self._keys: list[tuple[Any, ...]] = []
        try:
            self._claim(("path", str(self.real)))
            self._fd = self._lock_beside()
            self._lock_file()
        except BaseException:
            self.release()
            raise

    def _refusal(self, holder: str) -> InputError:
        return InputError(
            f"the {self.what} {self.path} is in use by another batchsum run ({holder}); "
            "wait for it to finish, or pass --wait"
        )

    def _waiting(self, holder: str) -> None:
        print(f"batchsum: waiting for the other run on {self.path} ({holder}) to finish", file=sys.stderr)

    def _claim(self, key: tuple[Any, ...]) -> None:
        with _held_guard:
            other = _held.get(key)
            if other is not None and other is not self:
                if other.what != self.what:
                    raise InputError(
                        f"the {self.what} {self.path} is the {other.what} {other.path} under another name; "
                        f"give the {self.what} a path of its own"
                    )
                raise self._refusal(f"pid {os.getpid()}, this process")
            _held[key] = self
            self._keys.append(key)

    def _unclaim(self, key: tuple[Any, ...]) -> None:
        with _held_guard:
            if _held.get(key) is self:
                del _held[key]
        self._keys.remove(key)

    def _lock_beside(self) -> int:
        """The lock on the resolved path: ``.NAME.lock`` beside the real file."""
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
                if not self._wait:
                    os.close(fd)
                    raise self._refusal(holder) from None
                self._waiting(holder)
                fcntl.flock(fd, fcntl.LOCK_EX)
            # The holder removes the lock file when it is done: a lock on a removed file holds nothing.
            try:
                same = os.stat(self._lock_path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        return fd

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        try:
            return os.open(self._lock_path, flags, 0o644)
        except OSError as exc:
            raise InputError(f"cannot lock {self.path}: {exc.strerror} ({self._lock_path})") from None

    def _lock_file(self) -> None:
        """The lock on the inode, while the file exists: an ``flock`` on the file itself, opened
        read-only (it is never written through this descriptor; SQLite's own locks are ``fcntl``
        locks, which ``flock`` does not meet). A file that cannot be opened (no read permission) or
        is not a regular file has the path lock only."""
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        while True:
            try:
                fd = os.open(self.real, flags)
            except OSError:
                return  # not there yet (its resolved path is its identity until it is created), or not ours to open
            if not self._hold_file(fd):
                return
            # Still the file at that path? An output renamed into place while this run waited is
            # another inode: lock that one instead.
            try:
                now = os.stat(self.real, follow_symlinks=False)
            except FileNotFoundError:
                return
            if self._inode == ("inode", now.st_dev, now.st_ino):
                return
            self._drop_file()

    def _hold_file(self, fd: int) -> bool:
        """Take the inode lock through ``fd`` (this lock keeps ``fd``); False, with ``fd`` closed,
        for a file that is not a regular file."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return False
        key = ("inode", st.st_dev, st.st_ino)
        try:
            self._claim(key)
        except InputError:
            os.close(fd)
            raise
        self._file_fd, self._inode = fd, key
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _flock_holder(st.st_dev, st.st_ino) or "another process"
            if not self._wait:
                raise self._refusal(holder) from None  # the caller releases
            self._waiting(holder)
            fcntl.flock(fd, fcntl.LOCK_EX)
        return True

    def _drop_file(self) -> None:
        if self._file_fd is not None:
            os.close(self._file_fd)  # closing releases the flock
            self._file_fd = None
        if self._inode is not None:
            self._unclaim(self._inode)
            self._inode = None

    @staticmethod
    def created(path: str | os.PathLike[str], fd: int) -> None:
        """The file at ``path`` was just created, through ``fd``, by this process: the ``RunLock``
        this process holds on ``path`` (if any) now locks its inode too. Raises ``InputError`` when
        another run reached the new file first (through a hard link made at once)."""
        with _held_guard:
            lock = _held.get(("path", os.path.realpath(path)))
        if lock is None or lock._file_fd is not None or lock._fd is None:
            return
        try:
            lock._hold_file(os.dup(fd))
        except InputError:
            lock._drop_file()
            raise

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):  # a folder made read-only: the lock file stays, unlocked
                self._lock_path.unlink(missing_ok=True)  # before unlocking: a waiter then sees it is gone
            os.close(self._fd)  # closing releases the flock
            self._fd = None
        self._drop_file()
        for key in list(self._keys):
            self._unclaim(key)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.release()


def _spill_files(path: Path) -> list[Path]:
    """Where a journal's unjournaled answers go: beside it, or in the user's cache folder (named
    after the journal's real path) when its folder cannot take them either."""
    import hashlib

    import platformdirs

    digest = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:16]
    cache = Path(platformdirs.user_cache_dir("batchsum", appauthor=False)) / "unsaved"
    return [path.with_name(path.name + ".unsaved.jsonl"), cache / f"{path.name}.{digest}.jsonl"]


def _is_journal(path: Path) -> str | None:
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


class Journal:
    """A SQLite-backed answer store. ``with Journal("run.journal.sqlite") as journal: ...``

    ``create``: make a new journal when there is none (exclusively). ``readonly``: look, never write
    (``--dry-run``, ``batchsum journal``). Raises ``InputError`` for a file that is not a batchsum
    journal or is damaged, leaving it as it was."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True, readonly: bool = False) -> None:
        self.path = Path(path)
        self.service: str | None = None  # whose answers are kept and reused (``serve``); None: any
        self._readonly = readonly
        self._unstamped = False
        if not self.path.parent.is_dir():
            raise InputError(f"cannot create the journal {self.path}: folder {self.path.parent} does not exist")
        if self.path.is_dir():
            raise InputError(f"the journal {self.path} is a folder; pass a file path with --journal")
        if os.path.lexists(self.path):
            problem = _is_journal(self.path)
            if problem is not None:
                raise InputError(
                    f"the journal {self.path} {problem}; it was left as it is (a run can take another with --journal)"
                )
        elif not create or readonly:
            raise InputError(f"no journal at {self.path}")
        else:
            self._create()
        try:
            uri = f"file:{self.path}?mode=ro" if readonly else f"file:{self.path}"
            self._db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            self._db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            if not readonly:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise InputError(f"cannot open the journal {self.path}: {exc}") from None
        if not readonly:
            self._import_spilled()

    def spill(self, answers: list[tuple[str, Answer]]) -> str | None:
        """Keep ``answers`` the journal could not take (a full disk, a read-only remount, a quota) in a
        side file that the next run's journal imports first: beside the journal, else in the user's
        cache folder. Where they went, or None when nowhere could take them either."""
        lines = "".join(json.dumps([self._key(key), *answer]) + "\n" for key, answer in answers).encode()
        for target in _spill_files(self.path):
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
                fd = os.open(target, flags, 0o600)
                try:
                    os.write(fd, lines)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError:
                continue
            return str(target)
        return None

    def _import_spilled(self) -> None:
        """Answers an earlier run could not journal (``spill``), taken in before anything is looked up."""
        for target in _spill_files(self.path):
            try:
                text = target.read_text(encoding="utf-8")
            except OSError:
                continue
            rows = []
            for line in text.splitlines():
                try:
                    key, *fields = json.loads(line)
                    rows.append((str(key), *Answer(*fields), time.time(), _service_of(str(key))))
                except (ValueError, TypeError):
                    continue  # a line cut short by the fault that made it: its answer is paid again
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.executemany(_INSERT, rows)
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error:
                return  # the journal still cannot take them: the side file stays for the next run
            target.unlink(missing_ok=True)

    def _create(self) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except FileExistsError:
            raise InputError(f"the journal {self.path} appeared while it was being created; run again") from None
        except OSError as exc:
            raise InputError(f"cannot create the journal {self.path}: {exc.strerror}") from None
        try:
            RunLock.created(self.path, fd)  # a new inode: the run's lock now holds it too
        finally:
            os.close(fd)
        try:
            db = sqlite3.connect(self.path, isolation_level=None)
            try:
                db.executescript(_SCHEMA)
            finally:
                db.close()
        except sqlite3.Error as exc:
            self.path.unlink(missing_ok=True)
            raise InputError(f"cannot create the journal {self.path}: {exc}") from None

    def serve(self, service: str) -> str | None:
        """Keep and reuse answers as ``service``'s (``contract.service_identity``): an answer is reused
        only for the same service and the same request. A journal written before answers carried
        their service is adopted by the first service that resumes it (stamped, so it is said once):
        what the adoption means, or None. A read-only journal is not stamped; its unstamped answers
        count as this service's."""
        self.service = service
        if (
            "service" in self._columns()
            and self._query("SELECT 1 FROM answers WHERE service IS NULL LIMIT 1").fetchone() is None
        ):
            return None
        if self._readonly:
            self._unstamped = True
            return None
        try:
            self._db.execute("BEGIN IMMEDIATE")  # the workers of one job may adopt it at once: one does
            try:
                if "service" not in self._columns():  # looked at again, inside the transaction
                    self._db.execute("ALTER TABLE answers ADD COLUMN service TEXT")
                adopted = self._db.execute(
                    "UPDATE answers SET fingerprint = ? || ' ' || fingerprint, service = ? WHERE service IS NULL",
                    (service, service),
                ).rowcount
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('adopted_by', ?)", (service,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise JournalError(f"the journal {self.path}: {exc}") from None
        if not adopted:
            return None
        return (
            f"the journal {self.path} was written before answers carried their service: its {adopted} "
            f"answers are taken as {service}'s"
        )

    def _columns(self) -> list[str]:
        return [row[1] for row in self._query("PRAGMA table_info(answers)").fetchall()]

    def _key(self, key: str) -> str:
        """A request's fingerprint as stored: with the service that answered it."""
        return key if self.service is None else f"{self.service} {key}"

    def get(self, key: str) -> Answer | None:
        return self.get_many([key]).get(key)

    def get_many(self, keys: list[str]) -> dict[str, Answer]:
        """The answers known for ``keys``, by key: one query per ``LOOKUP_CHUNK`` keys (a batch's
        look-up in bulk, not a query per row)."""
        found: dict[str, Answer] = {}
        stored = {self._key(key): key for key in keys}
        if self._unstamped:
            stored.update({key: key for key in keys})  # a read-only look at a journal not yet adopted
        names = list(stored)
        for start in range(0, len(names), LOOKUP_CHUNK):
            chunk = names[start : start + LOOKUP_CHUNK]
            rows = self._query(
                "SELECT fingerprint, summary, status, error, message, http_status, attempts FROM answers "
                f"WHERE fingerprint IN ({','.join('?' * len(chunk))})",
                tuple(chunk),
            ).fetchall()
            for key, *fields in rows:
                found[stored[key]] = Answer(*fields)
        return found

    def __contains__(self, key: str) -> bool:
        return key in self.get_many([key])

    def put(self, key: str, answer: Answer) -> None:
        """Keep ``answer``; committed at once (autocommit). ``JournalError`` when it cannot be written."""
        self._query(_INSERT, (self._key(key), *answer, time.time(), self.service))

    def note_output(self, output: str) -> None:
        """Remember which output this journal served (``batchsum journal`` shows it), without the
        credentials its location may hold (``redact_location``)."""
        self._query("INSERT OR REPLACE INTO meta VALUES ('output', ?)", (redact_location(str(output)),))

    def counts(self) -> dict[str, int]:
        """Answers by status (``ok``, ``failed``)."""
        return dict(self._query("SELECT status, COUNT(*) FROM answers GROUP BY status").fetchall())

    def last_write(self) -> float | None:
        (last,) = self._query("SELECT MAX(finished_at) FROM answers").fetchone()
        return float(last) if last is not None else None

    def meta(self) -> dict[str, str]:
        return dict(self._query("SELECT name, value FROM meta").fetchall())

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, args)
        except sqlite3.Error as exc:
            raise JournalError(f"the journal {self.path}: {exc}") from None

    def __len__(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM answers").fetchone()[0])

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Journal({str(self.path)!r})"


def _service_of(stored: str) -> str | None:
    """The service of a stored fingerprint (``Journal._key``), None for one written before services."""
    service, space, _ = stored.rpartition(" ")
    return service if space else None


class SharedJournal(Journal):
    """A journal several runs use at once, with claims (``engine.SharedAnswerStore``): a request
    is sent by the run that claims it; a claim is a lease (``stores.Leases``) that lapses within
    ``CLAIM_SECONDS`` of its holder's death, at once when the holder was a process of this machine."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True) -> None:
        super().__init__(path, create=create)
        self._owner = claim_owner()
        self._query(
            "CREATE TABLE IF NOT EXISTS claims (fingerprint TEXT PRIMARY KEY, owner TEXT NOT NULL, "
            "expires REAL NOT NULL)"
        )

    def claim(self, key: str) -> bool:
        now = time.time()
        cursor = self._query(
            "INSERT INTO claims VALUES (?, ?, ?) ON CONFLICT (fingerprint) DO UPDATE SET owner=excluded.owner, "
            "expires=excluded.expires WHERE claims.expires < ?",
            (key, self._owner, now + CLAIM_SECONDS, now),
        )
        if cursor.rowcount == 1:
            return True
        row = self._query("SELECT owner FROM claims WHERE fingerprint=?", (key,)).fetchone()
        if row is None or not holder_is_gone(row[0]):
            return False
        cursor = self._query(  # its holder died on this machine: take it over (one taker wins)
            "UPDATE claims SET owner=?, expires=? WHERE fingerprint=? AND owner=?",
            (self._owner, now + CLAIM_SECONDS, key, row[0]),
        )
        return cursor.rowcount == 1

    def release(self, key: str) -> None:
        self._query("DELETE FROM claims WHERE fingerprint=? AND owner=?", (key, self._owner))

    def renew(self, keys: Collection[str]) -> None:
        """Extend every claim this run still holds (one statement; ``keys`` are all of them)."""
        self._query("UPDATE claims SET expires=? WHERE owner=?", (time.time() + CLAIM_SECONDS, self._owner))


_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
_TAKE_OVER = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end "
    "return false"
)
_RENEW = (
    "for _, key in ipairs(KEYS) do if redis.call('GET', key) == ARGV[1] then redis.call('PEXPIRE', key, ARGV[2]) end "
    "end return 0"
)


class RedisStore:
    """Answers in Redis, for runs on many machines (``budget="redis://..."``): one key per answer
    under ``batchsum:answers:{IDENTITY}:`` (the key's identity, a hash), kept ``ttl`` seconds
    (30 days) after the last write; claims as ``SharedJournal``'s."""

    def __init__(self, url: str, identity: str, *, ttl: int = 30 * 86400) -> None:
        try:
            import redis
        except ImportError:
            raise BudgetError("a redis:// budget needs the redis package: pip install 'batchsum[redis]'") from None
        self._redis = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
        self._prefix = f"batchsum:answers:{{{identity}}}:"
        self._ttl = ttl
        self._owner = claim_owner()
        self._release = self._redis.register_script(_RELEASE)
        self._take_over = self._redis.register_script(_TAKE_OVER)
        self._renew = self._redis.register_script(_RENEW)

    def get(self, key: str) -> Answer | None:
        raw = self._redis.get(self._prefix + key)
        return Answer(*json.loads(raw)) if raw is not None else None

    def get_many(self, keys: list[str]) -> dict[str, Answer]:
        """The answers known for ``keys``: one ``MGET`` per ``LOOKUP_CHUNK`` keys."""
        found: dict[str, Answer] = {}
        for start in range(0, len(keys), LOOKUP_CHUNK):
            chunk = keys[start : start + LOOKUP_CHUNK]
            for key, raw in zip(chunk, self._redis.mget([self._prefix + key for key in chunk])):
                if raw is not None:
                    found[key] = Answer(*json.loads(raw))
        return found

    def put(self, key: str, answer: Answer) -> None:
        self._redis.set(self._prefix + key, json.dumps(list(answer)), ex=self._ttl)

    def claim(self, key: str) -> bool:
        name = f"{self._prefix}claim:{key}"
        lease = int(CLAIM_SECONDS * 1000)
        if self._redis.set(name, self._owner, nx=True, px=lease):
            return True
        holder = self._redis.get(name)
        if holder is None or not holder_is_gone(holder if isinstance(holder, str) else holder.decode()):
            return False
        return bool(self._take_over(keys=[name], args=[holder, self._owner, lease]))

    def release(self, key: str) -> None:
        self._release(keys=[f"{self._prefix}claim:{key}"], args=[self._owner])

    def renew(self, keys: Collection[str]) -> None:
        """Extend this run's claims on ``keys`` (one script call per ``LOOKUP_CHUNK`` keys)."""
        names = [f"{self._prefix}claim:{key}" for key in keys]
        for start in range(0, len(names), LOOKUP_CHUNK):
            self._renew(keys=names[start : start + LOOKUP_CHUNK], args=[self._owner, int(CLAIM_SECONDS * 1000)])

    def close(self) -> None:
        self._redis.close()
