"""Claims as leases: who holds one (``Holder``: a process, on this boot of its machine, in its pid
namespace), when a lease has lapsed (``lapsed``) and when its holder is surely gone
(``holder_is_gone``); the claims of a SQLite file (``SQLiteClaims``); and ``Leases``, the renewals a
run keeps up while it holds claims.

A lease's age is measured on the machine's monotonic clock, stamped with the boot id
(``/proc/sys/kernel/random/boot_id``): a wall clock stepped forward or back (NTP, a suspend, a
person) neither lapses a live lease nor keeps a dead one. A stamp from another boot of this machine
has lapsed; a stamp from another machine (a file on a shared disk) falls back to the lease's own
wall-clock expiry. A holder is judged gone at once only when it is surely on this machine and surely
dead: the same boot, the same pid namespace (its inode), and its pid gone or started at another time
than the holder's. Anything else (another container sharing the host name, a process of another
user, no ``/proc``) waits for its lease to lapse.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import json
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Collection
from typing import Any, Protocol

__all__ = [
    "CLAIM_SECONDS",
    "CLAIM_RENEW_SECONDS",
    "CLAIM_LOOK_FIRST",
    "CLAIM_LOOK_MOST",
    "Holder",
    "Leases",
    "SQLiteClaims",
    "claim_owner",
    "holder_is_gone",
    "lapsed",
    "now",
]

log = logging.getLogger("batchsum")

CLAIM_SECONDS = 20.0  # a lease: renewed while its holder lives, lapsed within this long of its death
CLAIM_RENEW_SECONDS = 5.0  # four renewals per lease: a stalled loop or a slow store does not lose it
# A text another run has on the wire is looked at again (with every text waiting: one look) when the
# store says an answer landed, else after a backoff from the first to the most, well within a lease.
CLAIM_LOOK_FIRST = 0.25
CLAIM_LOOK_MOST = 5.0

_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_MACHINE_IDS = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def now() -> tuple[float, float]:
    """The machine's monotonic clock and its wall clock, read together (tests step the wall clock)."""
    return time.monotonic(), time.time()


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read().strip()
    except OSError:
        return ""


def _inode(path: str) -> str:
    try:
        return str(os.stat(path).st_ino)
    except OSError:
        return ""


def _started(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat``, field 22), or
    None when it cannot be read (no such process, no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # after the command's name, which may hold anything
    try:
        return int(fields[19])  # field 22 of the whole line: the state is field 3
    except (IndexError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class _Here:
    """Where this process runs, read once per process (a fork reads again)."""

    pid: int
    host: str
    machine: str  # a hash of the machine id and the host name ("" when there is no machine id)
    boot: str  # this boot's id ("" off Linux)
    clocks: str  # the time namespace's inode: the monotonic clock is shared within one
    pids: str  # the pid namespace's inode: pids mean the same within one
    started: int | None


_here: _Here | None = None


def _where() -> _Here:
    global _here
    pid = os.getpid()
    if _here is None or _here.pid != pid:
        host = socket.gethostname()
        machine_id = next((found for path in _MACHINE_IDS if (found := _read(path))), "")
        machine = hashlib.sha256(f"{machine_id}\n{host}".encode()).hexdigest()[:16] if machine_id else ""
        _here = _Here(
            pid,
            host,
            machine,
            _read(_BOOT_ID),
            _inode("/proc/self/ns/time"),
            _inode("/proc/self/ns/pid"),
            _started(pid),
        )
    return _here


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a claim: a run (``token``, random: two runs of one process are two holders) in a
    process (``pid``, started at ``started``) of a pid namespace (``pids``), on a boot (``boot``)
    of a machine (``machine``, ``host``), with a monotonic clock of a time namespace (``clocks``).
    Stored as its ``text``."""

    token: str
    host: str
    machine: str
    boot: str
    clocks: str
    pids: str
    pid: int
    started: int | None

    @classmethod
    def new(cls) -> Holder:
        """A new holder: a run of this process."""
        here = _where()
        return cls(
            os.urandom(6).hex(), here.host, here.machine, here.boot, here.clocks, here.pids, here.pid, here.started
        )

    def text(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_text(cls, text: str | bytes | None) -> Holder | None:
        """The holder ``text`` describes; None for anything else (an older batchsum's ``host:pid:random``)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        try:
            fields: Any = json.loads(text) if text else None
            holder = cls(**fields)
        except (TypeError, ValueError):
            return None
        if not isinstance(holder.pid, int) or not (holder.started is None or isinstance(holder.started, int)):
            return None
        return holder


def claim_owner() -> str:
    """A new holder's text (``Holder.new().text()``)."""
    return Holder.new().text()


def holder_is_gone(holder: Holder | str | bytes | None) -> bool:
    """Is ``holder`` surely a dead process of this machine? Only when it ran on this boot, in this pid
    namespace, and its pid is gone or now belongs to a process started at another time. A holder on
    another machine, in another container (another pid namespace, even with the same host name), of
    an older batchsum, or this very process, is never judged here: its lease lapses on its own."""
    if not isinstance(holder, Holder):
        holder = Holder.from_text(holder)
    here = _where()
    if holder is None or not holder.boot or holder.boot != here.boot or not holder.pids or holder.pids != here.pids:
        return False
    if holder.pid == here.pid:
        return holder.started is not None and here.started is not None and holder.started != here.started
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: a process of another user has that pid; its start time tells
        pass
    started = _started(holder.pid)
    return started is not None and holder.started is not None and started != holder.started


def lapsed(
    holder: Holder | str | bytes | None, mono: float, expires: float, at: tuple[float, float] | None = None
) -> bool:
    """Has a lease lapsed? ``mono``: the monotonic clock when it was last renewed, ``expires``: the
    wall clock it lapses at, as its holder saw them; ``at``: ``now()``. On this boot (same monotonic
    clock) its age decides; from another boot of this machine it has lapsed; from another machine
    (or a holder that says nothing of its boot) its wall-clock expiry decides."""
    if not isinstance(holder, Holder):
        holder = Holder.from_text(holder)
    mono_now, wall_now = at if at is not None else now()
    here = _where()
    if holder is not None and holder.boot and holder.boot == here.boot and holder.clocks == here.clocks:
        return mono_now - mono > CLAIM_SECONDS
    if holder is not None and holder.machine and holder.machine == here.machine and holder.boot != here.boot:
        return True  # the machine rebooted since: its holder is gone with the boot
    return wall_now > expires


CLAIMS_TABLE = (
    "CREATE TABLE IF NOT EXISTS claims (fingerprint TEXT PRIMARY KEY, holder TEXT NOT NULL, mono REAL NOT NULL, "
    "expires REAL NOT NULL) WITHOUT ROWID"
)


class SQLiteClaims:
    """The claims of one holder (a run) in the ``claims`` table of a SQLite file several processes
    share (a shared journal, the machine's answer store). ``db``: the holder's connection, in
    autocommit; ``lock``: what guards it in this process."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock | threading.RLock) -> None:
        self._db = db
        self._lock = lock
        self.holder = Holder.new()
        self._text = self.holder.text()
        self.held: set[str] = set()  # the keys this holder claimed and has not let go

    @staticmethod
    def set_up(db: sqlite3.Connection) -> None:
        """The claims table, made (or remade, when an older batchsum's is there: its claims are
        fleeting) in one transaction."""
        db.execute("BEGIN IMMEDIATE")
        try:
            found = [row[1] for row in db.execute("PRAGMA table_info(claims)").fetchall()]
            if found and "holder" not in found:
                db.execute("DROP TABLE claims")
            db.execute(CLAIMS_TABLE)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def claim(self, key: str) -> bool:
        """True when this holder now holds ``key``: it was free (one statement), its lease lapsed, its
        holder is surely gone (one taker wins), or the row is this holder's own from a claim it let go
        of without removing the row (a release that failed: taken back, never waited on). False when
        it is held, by another or by this holder already."""
        mono, wall = now()
        with self._lock:
            row = (key, self._text, mono, wall + CLAIM_SECONDS)
            if self._db.execute("INSERT OR IGNORE INTO claims VALUES (?, ?, ?, ?)", row).rowcount == 1:
                self.held.add(key)
                return True
        return self.claim_many([key])[key]

    def claim_many(self, keys: Collection[str]) -> dict[str, bool]:
        """``claim`` for each of ``keys``, in one write transaction."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                won = self.claim_here(keys)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self.taken(won)
        return won

    def claim_here(self, keys: Collection[str]) -> dict[str, bool]:
        """``claim`` for each of ``keys`` in the caller's write transaction (an answer store looks for
        each key's answer in the same one); the caller passes the outcome to ``taken`` once it commits."""
        mono, wall = at = now()
        db, won = self._db, {}
        for key in keys:
            row = (key, self._text, mono, wall + CLAIM_SECONDS)
            if db.execute("INSERT OR IGNORE INTO claims VALUES (?, ?, ?, ?)", row).rowcount == 1:
                won[key] = True
                continue
            found = db.execute("SELECT holder, mono, expires FROM claims WHERE fingerprint=?", (key,)).fetchone()
            if found is None:
                take = True
            elif found[0] == self._text:
                take = key not in self.held
            else:
                take = lapsed(found[0], found[1], found[2], at) or holder_is_gone(found[0])
            if take:
                db.execute("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?)", row)
            won[key] = take
        return won

    def taken(self, won: dict[str, bool]) -> None:
        """The claims ``claim_here`` won, now committed: held."""
        self.held.update(key for key, claimed in won.items() if claimed)

    def held_elsewhere(self, keys: Collection[str]) -> set[str]:
        """Which of ``keys`` another holder holds now (a live lease): a read, no write lock taken."""
        at = now()
        keys = list(keys)
        busy: set[str] = set()
        with self._lock:
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                rows = self._db.execute(
                    f"SELECT fingerprint, holder, mono, expires FROM claims WHERE fingerprint IN ({','.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
                for key, holder, mono, expires in rows:
                    if holder == self._text and key in self.held:
                        continue
                    if not lapsed(holder, mono, expires, at) and not holder_is_gone(holder):
                        busy.add(key)
        return busy

    def release(self, key: str) -> None:
        """``key``'s claim let go, when this holder still holds it (released already: nothing to do)."""
        with self._lock:
            if key in self.held:
                self.release_here(key)
                self.held.discard(key)

    def release_many(self, keys: Collection[str]) -> None:
        """The claims on ``keys`` this holder still holds, let go in one transaction."""
        with self._lock:
            mine = [key for key in keys if key in self.held]
            if not mine:
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for key in mine:
                    self.release_here(key)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self.held.difference_update(mine)

    def release_here(self, key: str) -> None:
        """``key``'s row deleted in the caller's transaction (an answer kept and its claim let go in
        one commit); the caller takes it out of ``held`` once that commits. Until then (a delete or a
        commit that failed) the claim is still held: renewed, and let go by the next release."""
        self._db.execute("DELETE FROM claims WHERE fingerprint=? AND holder=?", (key, self._text))

    def renew(self) -> None:
        """The claims this holder holds (``held``) renewed, in one transaction; no other row of its
        own (one it let go of, or lost) is kept alive."""
        mono, wall = now()
        with self._lock:
            if not self.held:
                return
            rows = [(mono, wall + CLAIM_SECONDS, key, self._text) for key in self.held]
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("UPDATE claims SET mono=?, expires=? WHERE fingerprint=? AND holder=?", rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise


class Renewing(Protocol):
    def renew(self, keys: Collection[str]) -> Any: ...  # None, or an awaitable (a store's own thread)


class Leases:
    """The claims one run holds, renewed every ``CLAIM_RENEW_SECONDS`` while any is held (one
    renewal call for all of them, awaited when the store runs it on its own thread). ``hold`` after a claim is won, ``drop`` after its release,
    ``close`` at the run's end."""

    def __init__(self, store: Renewing) -> None:
        self._store = store
        self.held: set[str] = set()
        self._keeper: asyncio.Task[None] | None = None

    def hold(self, key: str) -> None:
        self.held.add(key)
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.ensure_future(self._keep())

    def drop(self, key: str) -> None:
        self.held.discard(key)

    async def _keep(self) -> None:
        while self.held:
            await asyncio.sleep(CLAIM_RENEW_SECONDS)
            if not self.held:
                return
            try:
                renewed = self._store.renew(list(self.held))  # one call for all of them
                if inspect.isawaitable(renewed):
                    await renewed
            except Exception:  # noqa: BLE001 - a lease not renewed lapses: at worst paid twice
                log.warning("could not renew claims in the shared answer store", exc_info=True)

    def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
        self.held.clear()
