"""``MachineStore``: the answer store every run of this user on this machine shares, a SQLite file in
the user's cache folder (``answers.sqlite``, mode 0600), or any file ``store="sqlite:///PATH"`` names.

An answer is kept by what makes it: the service (``contract.service_identity``), the store's scope
(``""``: every key of the service; a key's hash with ``store_scope="key"``) and the request's
fingerprint (``engine.fingerprints``); never by an output or a run. Only summaries are shared (a
refusal stays in the output's journal); a job with no journal, whose workers share the store as their
only scope, keeps its refusals there too, for itself alone (by its ``job``) and for a day
(``REFUSAL_SECONDS``). Many processes use the file at once (WAL, a busy timeout), with the claims and
leases of ``leases``, so two jobs starting together pay once. Its upkeep (the retention and the size
cap, pruned in small transactions on a thread of its own; the old per-key stores imported when it is
first opened; entries listed and removed) is in ``store_upkeep``.

A store the user cannot write (a read-only folder or file system, a file of another user's) is
opened to read (``open_readonly``): SQLite reads a WAL file read-only while its ``-shm`` exists (a
writer has it open) or can be made; with neither, nothing is writing it, and it is read as
``immutable`` until a ``-wal`` appears beside it (a writer began), when it is opened read-only again,
through the writer's ``-shm``, so that what the writer commits is seen and a checkpoint never reads torn.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

from .leases import SQLiteClaims
from .results import OK, Answer
from .store_file import FORMAT as FORMAT
from .store_file import REFUSALS as REFUSALS
from .store_file import SCHEMA as SCHEMA
from .store_file import connect_store as connect_store
from .store_file import default_store_path as default_store_path
from .store_file import open_readonly, open_to_read, store_format, where_file, writable
from .stores import LOOKUP_CHUNK, REFUSAL_SECONDS, StoreError

__all__ = ["MachineStore", "FORMAT", "SCHEMA", "REFUSALS", "default_store_path", "connect_store"]

_PUT = (
    "INSERT OR REPLACE INTO answers (service, scope, fingerprint, summary, attempts, written) VALUES (?, ?, ?, ?, ?, ?)"
)
_PUT_REFUSAL = "INSERT OR REPLACE INTO refusals VALUES (?, ?, ?, ?, ?)"


class MachineStore:
    """The answers of ``service`` (in ``scope``) in the store file at ``path`` (``default_store_path()``),
    and this run's claims there: the shared store a run uses (``scopes.Scopes``, through
    ``store_link.StoreLink``). ``readonly``: only to look (a dry run); a store this user cannot write
    is opened so too (``writable`` False: read, never written, no claims). ``job``: the job whose
    refusals it keeps too (see the module docstring; None: summaries only). ``StoreError`` when it
    cannot be opened or used."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        service: str,
        *,
        readonly: bool = False,
        job: str | None = None,
        scope: str = "",
    ) -> None:
        self.path = Path(path)
        self.service, self.scope, self.job = service, scope, job
        self.where = where_file(self.path)
        self._lock = threading.RLock()
        self.writable = self.claims = not readonly and writable(self.path)
        self._immutable = False
        if self.writable:
            self._db = connect_store(self.path)
        else:
            self._db, self._immutable = open_to_read(self.path)
        self.format = store_format(self._db)
        self._claims = SQLiteClaims(self._db, self._lock)
        self._version: int | None = None

    @contextlib.contextmanager
    def _using(self) -> Iterator[sqlite3.Connection]:
        """Its connection for one call, under its lock (an immutable one opened again through the
        writer's ``-shm`` once a writer has appeared: its ``-wal``); SQLite's errors as ``StoreError``."""
        try:
            with self._lock:
                if self._immutable and os.path.exists(f"{self.path}-wal"):
                    with contextlib.suppress(sqlite3.Error):  # the writer still making its files: next call
                        db, self._immutable = open_readonly(self.path)
                        self._db.close()
                        self._db = self._claims._db = db
                yield self._db
        except sqlite3.Error as exc:
            raise StoreError(f"the answer store {self.path}: {exc}") from None

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """``_using``, in one write transaction."""
        with self._using() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    @property
    def connection(self) -> sqlite3.Connection:
        """Its connection: the store's upkeep uses it when the store opens (``store_upkeep.keep_up``),
        before the store is used, so that opening it takes one connection."""
        return self._db

    def get(self, key: str) -> Answer | None:
        return self.get_many([key]).get(key)

    def get_many(self, keys: list[str], since: float | None = None) -> dict[str, Answer]:
        """The answers kept for ``keys`` (fingerprints), and the job's refusals of the last day for
        the others: one query each per ``LOOKUP_CHUNK`` keys. ``since``: only those written since
        then (``time.time()``: a refreshing run's own, or another's while it ran)."""
        with self._using() as db:
            return _found(db, self, keys, since)

    def put(self, key: str, answer: Answer) -> None:
        """Keep ``answer``: a summary for every job of its scope (it replaces what was kept:
        ``refresh``); a refusal for this store's ``job`` alone, for a day (no job: not kept, it stays
        in the output's journal). Its claim, if this run holds it, let go in the same commit."""
        self.put_many([(key, answer)])

    def put_many(self, answers: Iterable[tuple[str, Answer]]) -> None:
        """``put`` for each of ``answers``, in one transaction."""
        rows = [row for key, answer in answers if (row := _row(self, key, answer)) is not None]
        mine = [claim for _, _, claim in rows if claim in self._claims.held]
        if len(rows) == 1 and not mine:
            with self._using() as db:
                db.execute(rows[0][0], rows[0][1])
        elif rows:
            with self._writing() as db:  # the answers kept and their claims let go: one commit
                for sql, row, _ in rows:
                    db.execute(sql, row)
                for claim in mine:
                    self._claims.release_here(claim)
            self._claims.held.difference_update(mine)

    def claim_key(self, key: str) -> str:
        """How a claim on ``key`` is named in the claims table: by service (and scope)."""
        return f"{self.service} {key}" if not self.scope else f"{self.service} {self.scope} {key}"

    def claim(self, key: str) -> bool:
        with self._using():
            return self._claims.claim(self.claim_key(key))

    def release(self, key: str) -> None:
        self.release_many([key])

    def release_many(self, keys: Collection[str]) -> None:
        """This run's claims on ``keys`` let go, in one transaction."""
        with self._using():
            self._claims.release_many([self.claim_key(key) for key in keys])

    def renew(self, keys: Collection[str]) -> None:
        """The claims this run holds renewed (``SQLiteClaims.renew``: those it knows, which ``keys`` are)."""
        with self._using():
            self._claims.renew()

    def take_many(self, keys: Collection[str], since: float | None = None, look: bool = True) -> dict[str, Any]:
        """At a request's turn, for each of ``keys``, in one write transaction: its answer when the
        store has one (``look``; written since ``since``), else True when this run now holds its claim,
        False when another run holds it (it has the text on the wire)."""
        keys = list(keys)
        with self._writing() as db:
            found = _found(db, self, keys, since) if look else {}
            names = {self.claim_key(key): key for key in keys if key not in found}
            won = self._claims.claim_here(list(names))
        self._claims.taken(won)
        return {**{names[name]: claimed for name, claimed in won.items()}, **found}

    def look_many(self, keys: Collection[str], since: float | None = None) -> tuple[dict[str, Answer], set[str]]:
        """For texts another run has on the wire, in one read: the answers the store has now, and
        which of the others another run still holds (a live lease)."""
        keys = list(keys)
        with self._using() as db:
            db.execute("BEGIN")  # one snapshot for both reads (a read transaction: no lock on writers)
            try:
                found = _found(db, self, keys, since)
                names = {self.claim_key(key): key for key in keys if key not in found}
                held = {names[name] for name in self._claims.held_elsewhere(list(names))}
            finally:
                db.execute("COMMIT")
        return found, held

    def changed(self) -> bool:
        """Has another connection committed anything since the last call (``PRAGMA data_version``)?"""
        with self._using() as db:
            (version,) = db.execute("PRAGMA data_version").fetchone()
        moved = bool(version != self._version)
        self._version = int(version)
        return moved

    def ping(self) -> None:
        """A read, to see that the store answers again (``StoreError`` while it does not)."""
        with self._using() as db:
            db.execute("SELECT value FROM meta WHERE name='format'").fetchone()

    def __len__(self) -> int:
        if self.format == 1 and self.scope:
            return 0  # a format-1 store (read-only here) keeps no answer to a key
        where, args = _whose(self)
        with self._using() as db:
            return int(db.execute(f"SELECT COUNT(*) FROM answers WHERE {where}", args).fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __repr__(self) -> str:
        return f"MachineStore({str(self.path)!r})"


def _found(db: sqlite3.Connection, store: MachineStore, keys: list[str], since: float | None) -> dict[str, Answer]:
    """``MachineStore.get_many`` on the connection ``db``."""
    found: dict[str, Answer] = {}
    oldest = -math.inf if since is None else since
    recent = "" if since is None else " AND written>=?"  # by the primary key either way
    if store.format == 1 and store.scope:
        return found  # a store of format 1 (read-only here) has no answers kept to a key
    where, args = _whose(store)
    for start in range(0, len(keys), LOOKUP_CHUNK):
        chunk = keys[start : start + LOOKUP_CHUNK]
        rows = db.execute(
            f"SELECT fingerprint, summary, attempts FROM answers WHERE {where} AND fingerprint IN "
            f"({','.join('?' * len(chunk))}){recent}",
            (*args, *chunk, *(() if since is None else (since,))),
        ).fetchall()
        for key, summary, attempts in rows:
            found[key] = Answer(summary, OK, None, None, 200, attempts)
        rest = [key for key in chunk if key not in found]
        if store.job is not None and rest:
            refused = db.execute(
                "SELECT fingerprint, answer FROM refusals WHERE job=? AND service=? AND written>=? AND "
                f"fingerprint IN ({','.join('?' * len(rest))})",
                (store.job, store.service, max(oldest, time.time() - REFUSAL_SECONDS), *rest),
            ).fetchall()
            for key, answer in refused:
                found[key] = Answer(*json.loads(answer))
    return found


def _whose(store: MachineStore) -> tuple[str, tuple[Any, ...]]:
    """Which answers are the store's: its service's (and scope's, from format 2)."""
    if store.format == 1:
        return "service=?", (store.service,)
    return "service=? AND scope=?", (store.service, store.scope)


def _row(store: MachineStore, key: str, answer: Answer) -> tuple[str, tuple[Any, ...], str] | None:
    """The statement that keeps ``answer`` (None: not kept), its row, and the claim it lets go."""
    row: tuple[Any, ...]
    if answer.status == OK and answer.summary is not None:
        row = (store.service, store.scope, key, answer.summary, answer.attempts, time.time())
        return _PUT, row, store.claim_key(key)
    if store.job is not None:
        row = (store.job, store.service, key, json.dumps(list(answer)), time.time())
        return _PUT_REFUSAL, row, store.claim_key(key)
    return None
