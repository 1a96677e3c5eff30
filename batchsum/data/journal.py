"""The SQLite journal: finished answers by request fingerprint, kept across runs and crashes, held by
one run at a time (``RunLock``, in ``run_lock``, the lock a run takes on its journal and its output).

Each answer is committed as it arrives. In WAL mode with ``synchronous=NORMAL`` a commit is one
append to the write-ahead log, with no fsync: a killed process (SIGKILL, Ctrl-C, a crash) loses
nothing, because the data is already with the operating system; the log is synced at checkpoints,
so a power cut loses at most the last few seconds the OS had not written back, and SQLite never
leaves a corrupt file. Only answers worth keeping are written (summaries and permanent refusals);
transient failures are tried again on the next run.

A file that is not a batchsum journal (another program's database, any other file) is refused and
left as it was; a new journal is created exclusively, never through a link planted at its name.

Several runs at once (Dask partitions with a named journal) share it as a ``SharedJournal``, with
claims, so that a request another run is already sending is awaited, not paid for again. What every
job of the machine or the cluster shares is the answer store (``machine_store``, ``redis_store``).

The journal's file format is in ``journal_file``, its side file of answers it could not take in
``side_file``; both, and the run's lock, are importable from here as before.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from ..service.errors import InputError, JournalError, redact_location
from .journal_file import CACHE_KIB as CACHE_KIB
from .journal_file import FORMAT as FORMAT
from .journal_file import adopt, columns, connect, insert_all, problem
from .journal_file import create as create_journal
from .leases import SQLiteClaims
from .results import Answer
from .run_lock import RunLock as RunLock
from .side_file import SideFile
from .stores import LOOKUP_CHUNK as LOOKUP_CHUNK

__all__ = ["Journal", "SharedJournal", "RunLock", "FORMAT"]


# A journal of at most this many bytes is read whole, once a run has asked it for a quarter of its
# answers (a rerun asks for all of them): one scan instead of a query per block of keys.
WHOLE_READ_BYTES = 16 << 20
WRITTEN_KEYS = 100_000  # the keys a journal empty when first asked remembers writing (about 15 MB at most)


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
        self._whole = _Whole(True)  # read whole when small and asked for much of it
        self._side = SideFile(self.path)  # answers it could not take, until the next run
        _check_or_create(self.path, create=create and not readonly)
        self._db = connect(self.path, readonly=readonly)
        if not readonly:
            self._import_spilled()

    def spill(self, answers: list[tuple[str, Answer]]) -> str | None:
        """Keep ``answers`` the journal could not take (a full disk, a read-only remount, a quota) in a
        side file that the next run's journal imports first: beside the journal, else in the user's
        cache folder. Where they went, or None when nowhere could take them either."""
        return self._side.keep([(self._key(key), answer) for key, answer in answers])

    def _import_spilled(self) -> None:
        """Answers an earlier run could not journal (``spill``), taken in before anything is looked up."""
        for target, answers in self._side.kept():
            rows = [(key, *answer, time.time(), _service_of(key)) for key, answer in answers]
            try:
                insert_all(self._db, rows)
            except sqlite3.Error:
                return  # the journal still cannot take them: the side file stays for the next run
            target.unlink(missing_ok=True)

    def serve(self, service: str) -> str | None:
        """Keep and reuse answers as ``service``'s (``contract.service_identity``): an answer is reused
        only for the same service and the same request. A journal written before answers carried
        their service is adopted by the first service that resumes it (stamped, so it is said once):
        what the adoption means, or None. A read-only journal is not stamped; its unstamped answers
        count as this service's."""
        self.service = service
        self._whole.forget()  # what it holds is about to be stamped: read again
        if (
            "service" in self._columns()
            and self._query("SELECT 1 FROM answers WHERE service IS NULL LIMIT 1").fetchone() is None
        ):
            return None
        if self._readonly:
            self._unstamped = True
            return None
        adopted = adopt(self._db, self.path, service)
        if not adopted:
            return None
        return (
            f"the journal {self.path} was written before answers carried their service: its {adopted} "
            f"answers are taken as {service}'s"
        )

    def _columns(self) -> list[str]:
        try:
            return columns(self._db)
        except sqlite3.Error as exc:
            raise JournalError(f"the journal {self.path}: {exc}") from None

    def _key(self, key: str) -> str:
        """A request's fingerprint as stored: with the service that answered it."""
        return key if self.service is None else f"{self.service} {key}"

    def get(self, key: str) -> Answer | None:
        return self.get_many([key]).get(key)

    def get_many(self, keys: list[str], since: float | None = None) -> dict[str, Answer]:
        """The answers known for ``keys``, by key: one query per ``LOOKUP_CHUNK`` keys (a batch's
        look-up in bulk, not a query per row). ``since``: only those written since then
        (``time.time()``: a refreshing run's own)."""
        found: dict[str, Answer] = {}
        stored = {self._key(key): key for key in keys}
        if self._unstamped:
            stored.update({key: key for key in keys})  # a read-only look at a journal not yet adopted
        whole = self._whole.answers(self._query, len(keys)) if since is None else None
        if whole is not None:
            return {key: whole[name] for name, key in stored.items() if name in whole}
        names = self._whole.may_hold(stored)
        recent = "" if since is None else " AND finished_at >= ?"
        for start in range(0, len(names), LOOKUP_CHUNK):
            chunk = names[start : start + LOOKUP_CHUNK]
            rows = self._query(
                "SELECT fingerprint, summary, status, error, message, http_status, attempts FROM answers "
                f"WHERE fingerprint IN ({','.join('?' * len(chunk))}){recent}",
                (*chunk, *(() if since is None else (since,))),
            ).fetchall()
            for key, *fields in rows:
                found[stored[key]] = Answer(*fields)
        return found

    def __contains__(self, key: str) -> bool:
        return key in self.get_many([key])

    def put(self, key: str, answer: Answer) -> None:
        """Keep ``answer``; committed at once. ``JournalError`` when it cannot be written."""
        self.put_many([(key, answer)])

    def put_many(self, answers: list[tuple[str, Answer]]) -> None:
        """Keep ``answers`` in one transaction (the answer store's, copied into the journal of the
        output they answer). ``JournalError`` when they cannot be written."""
        now, service = time.time(), self.service
        named = [(self._key(key), answer) for key, answer in answers]
        try:
            insert_all(self._db, [(name, *answer, now, service) for name, answer in named])
        except sqlite3.Error as exc:
            raise JournalError(f"the journal {self.path}: {exc}") from None
        self._whole.kept(named)

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


class _Whole:
    """A journal's answers in memory, by stored key: read in one scan once a run has asked for a
    quarter of the answers of a journal of at most ``WHOLE_READ_BYTES`` (a rerun asks for every one),
    then kept up to date with what the run writes. Until then every look-up asks the file. A journal
    empty when first asked (a first run, a new output the store answers) keeps the keys written since
    instead (up to ``WRITTEN_KEYS``): a look-up asks the file only for those."""

    __slots__ = ("_enabled", "_answers", "_asked", "_count", "_written")

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled  # never, for a journal other runs write too
        self.forget()

    def forget(self) -> None:
        """Nothing in memory (what it held is out of date): read again when it is worth it."""
        self._answers: dict[str, Answer] | None = None
        self._asked = 0  # keys looked up so far
        self._count: int | None = None if self._enabled else -1  # the answers it held when first asked; -1: never
        self._written: set[str] | None = None  # empty when first asked: every key written since

    def answers(self, query: Callable[[str], sqlite3.Cursor], asked: int) -> dict[str, Answer] | None:
        """The answers in memory (read now when ``asked`` more keys make it worth it), or None."""
        if self._answers is not None:
            return self._answers
        if self._count is None:
            (pages,) = query("PRAGMA page_count").fetchone()
            (page,) = query("PRAGMA page_size").fetchone()
            small = pages * page <= WHOLE_READ_BYTES
            self._count = query("SELECT COUNT(*) FROM answers").fetchone()[0] if small else -1
            if self._count == 0:  # nothing to read: what this run writes is all it will hold
                self._count, self._written = -1, set()
        if self._count < 0:
            return None
        self._asked += asked
        if 4 * self._asked < self._count:
            return None
        rows = query(
            "SELECT fingerprint, summary, status, error, message, http_status, attempts FROM answers"
        ).fetchall()
        self._answers = {key: Answer(*fields) for key, *fields in rows}
        return self._answers

    def may_hold(self, names: dict[str, str]) -> list[str]:
        """Of ``names`` (stored keys), those the file may hold: all of them, unless it was empty when
        first asked (then only those written since)."""
        written = self._written
        return list(names) if written is None else [name for name in names if name in written]

    def kept(self, answers: list[tuple[str, Answer]]) -> None:
        """``answers`` were written (by stored key): in memory too, once it is read, unless it has grown
        to twice what was read (then it is the file's again, for good: a run that adds more than it
        reuses does not hold them all); their keys, when it was empty when first asked."""
        if self._answers is not None:
            self._answers.update(answers)
            if len(self._answers) > 2 * max(self._count or 0, 10_000):
                self._answers, self._count = None, -1
        if self._written is not None:
            self._written.update(name for name, _ in answers)
            if len(self._written) > WRITTEN_KEYS:
                self._written = None  # the file is asked for every key again


def _check_or_create(path: Path, *, create: bool) -> None:
    """``path`` is a batchsum journal in good order, or is made one (``create``); else ``InputError``."""
    if not path.parent.is_dir():
        raise InputError(f"cannot create the journal {path}: folder {path.parent} does not exist")
    if path.is_dir():
        raise InputError(f"the journal {path} is a folder; pass a file path with --journal")
    if os.path.lexists(path):
        why = problem(path)
        if why is not None:
            raise InputError(f"the journal {path} {why}; it was left as it is (a run can take another with --journal)")
    elif not create:
        raise InputError(f"no journal at {path}")
    else:
        create_journal(path)


def _service_of(stored: str) -> str | None:
    """The service of a stored fingerprint (``Journal._key``), None for one written before services."""
    service, space, _ = stored.rpartition(" ")
    return service if space else None


class SharedJournal(Journal):
    """A journal several runs use at once, with claims (``engine.SharedAnswerStore``): a request
    is sent by the run that claims it; a claim is a lease (``leases``) that lapses within
    ``CLAIM_SECONDS`` of its holder's death (measured on the machine's monotonic clock), at once when
    its holder was surely a process of this machine that is gone."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True) -> None:
        super().__init__(path, create=create)
        self._whole = _Whole(False)  # the other runs write it too: every look-up asks the file
        try:
            SQLiteClaims.set_up(self._db)
        except sqlite3.Error as exc:
            raise JournalError(f"the journal {self.path}: {exc}") from None
        self._claims = SQLiteClaims(self._db, threading.Lock())

    def claim(self, key: str) -> bool:
        try:
            return self._claims.claim(key)
        except sqlite3.Error as exc:
            raise JournalError(f"the journal {self.path}: {exc}") from None

    def release(self, key: str) -> None:
        try:
            self._claims.release(key)
        except sqlite3.Error as exc:
            raise JournalError(f"the journal {self.path}: {exc}") from None

    def renew(self, keys: Collection[str]) -> None:
        """Extend the claims this run holds (``SQLiteClaims.renew``: the ones it knows it holds, which
        ``keys`` are)."""
        try:
            self._claims.renew()
        except sqlite3.Error as exc:
            raise JournalError(f"the journal {self.path}: {exc}") from None

    def held_elsewhere(self, keys: Collection[str]) -> set[str]:
        """Which of ``keys`` another run holds now (a read: texts set aside, looked at together)."""
        try:
            return self._claims.held_elsewhere(keys)
        except sqlite3.Error as exc:
            raise JournalError(f"the journal {self.path}: {exc}") from None
