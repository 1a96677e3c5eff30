"""``SQLiteBudget``: a key's budget shared by every process on this machine, one row per budget in a
SQLite file (the default, ``"machine"``; ``sqlite_file.SQLiteFile``), with the key's counts per tick,
the lead of its search, its quotas' counts, and the runs' registry (who is on each key, a job's stop).
"""

from __future__ import annotations

import dataclasses
import math
import sqlite3
import time
from collections.abc import Sequence

from .exchange import (
    AHEAD,
    ENTRY_CHARS,
    LEASE_SECONDS,
    LOOK,
    NO_REPORT,
    RESERVE,
    RESERVE_ONLY,
    RUN_LEASE_SECONDS,
    SHARED_SECONDS,
    STOP_SECONDS,
    BudgetReset,
    Lead,
    Member,
    QuotaCounts,
    Report,
    RunEntry,
    Share,
    Slot,
)
from .gcra import KEEP_SECONDS, MINUTE, State, Step, deferred, share_wait
from .ledger import KEEP_TICKS, LEDGER_SECONDS, Ledger, Tally, tick_of
from .outage import hurried
from .sqlite_file import SQLiteFile

__all__ = ["SQLiteBudget"]

# The budget's row, in ``gcra.State``'s order.
_FIELDS = tuple(field.name for field in dataclasses.fields(State))
_STATE = ", ".join(_FIELDS)
_TALLY = (
    "INSERT INTO tallies VALUES (?, ?, ?, ?, ?) ON CONFLICT (id, tick) DO UPDATE SET "
    "starts = starts + excluded.starts, answered = answered + excluded.answered, refused = refused + excluded.refused"
)


class SQLiteBudget(SQLiteFile):
    """Every process on this machine: one row per budget in a SQLite file, advanced in a
    ``BEGIN IMMEDIATE`` transaction on the machine's wall clock (the same in every process)."""

    async def _call(
        self,
        what: int,
        interval: float,
        report: Report,
        share: Share | None,
        count: int = 1,
        lead: float = 0.0,
        live: float = 0.0,
    ) -> Slot:
        return await self._transaction(lambda db: self._step(db, what, interval, report, share, (count, lead), live))

    def _step(
        self,
        db: sqlite3.Connection,
        what: int,
        interval: float,
        report: Report,
        share: Share | None,
        ahead: tuple[int, float] = (1, 0.0),
        live: float = 0.0,
    ) -> Slot:
        now = time.time()
        row = db.execute(f"SELECT {_STATE} FROM budgets WHERE id=?", (self.id,)).fetchone()
        state = State(*row) if row else State()
        turn = None
        if what in (RESERVE, RESERVE_ONLY, AHEAD) and share is not None:
            ahead = (1, ahead[1])  # a shared run's own schedule goes one start at a time
            own = db.execute("SELECT tat FROM shares WHERE id=? AND holder=?", (self.id, share.holder)).fetchone()
            turn = share_wait(own[0] if own else -math.inf, now, share.own_interval(interval))
        step = state.advance(now, interval, report, LOOK if turn is not None else what, *ahead, live)
        if share is not None and what in (RESERVE, RESERVE_ONLY, AHEAD) and step.at is not None:
            db.execute(
                "INSERT OR REPLACE INTO shares VALUES (?, ?, ?)",
                (self.id, share.holder, step.at + share.own_interval(interval)),
            )
            db.execute("DELETE FROM shares WHERE id=? AND tat < ?", (self.id, now - KEEP_SECONDS))
        if row or what != LOOK or report != NO_REPORT or live > 0:
            db.execute(
                f"INSERT OR REPLACE INTO budgets (id, {_STATE}) VALUES (?{', ?' * len(_FIELDS)})",
                (self.id, *(getattr(state, name) for name in _FIELDS)),
            )
        stop = _registry_step(db, self.id, now, report)
        tallies = [(self.id, tick_of(now), 1, 0, 0)] if step.committed else []
        tallies += [(self.id, tick_of(now - age), 1, 0, 0) for age in report.started]
        tallies += [(self.id, tick_of(now - age), 0, 1, 0) for age in report.answered]
        tallies += [(self.id, tick_of(now - age), 0, 0, 1) for age in report.refused]
        if tallies:
            db.executemany(_TALLY, tallies)
            if step.committed and tick_of(now) % 100 == 0:  # now and then, the old ticks go
                db.execute("DELETE FROM tallies WHERE id=? AND tick < ?", (self.id, tick_of(now) - KEEP_TICKS))
        starts, answered, refused = db.execute(
            "SELECT COALESCE(SUM(starts), 0), COALESCE(SUM(answered), 0), COALESCE(SUM(refused), 0) FROM tallies "
            "WHERE id=? AND tick >= ?",
            (self.id, tick_of(now - MINUTE)),
        ).fetchone()
        slot = deferred(state.slot(now, step, int(starts), int(refused), int(answered)), turn)
        return dataclasses.replace(slot, epoch=self.epoch, stop=stop)

    async def runs(self) -> list[RunEntry]:
        return await self._transaction(lambda db: _runs(db, self.id)) if self.path.exists() else []

    async def leave(self, member: Member) -> None:
        with hurried():  # a run's entry lapses on its own: not worth waiting for an outage
            await self._transaction(
                lambda db: db.execute("DELETE FROM runs WHERE id=? AND member=?", (self.id, member.member))
            )

    async def post_stop(self, run_id: str, cause: str) -> None:
        def write(db: sqlite3.Connection) -> None:
            now = time.time()
            db.execute("INSERT OR REPLACE INTO stops VALUES (?, ?, ?, ?)", (self.id, run_id, cause, now))
            db.execute("DELETE FROM stops WHERE at < ?", (now - STOP_SECONDS,))

        await self._transaction(write)

    async def ledger(self, seconds: float = LEDGER_SECONDS) -> Ledger:
        def read(db: sqlite3.Connection) -> Ledger:
            now = time.time()
            rows = db.execute(
                "SELECT tick, starts, answered, refused FROM tallies WHERE id=? AND tick >= ?",
                (self.id, tick_of(now - seconds)),
            ).fetchall()
            return Ledger.of(now, [Tally(*row) for row in rows], seconds)

        return await self._transaction(read)

    async def lead(self, holder: str, state: str | None = None, *, release: bool = False) -> Lead:
        def step(db: sqlite3.Connection) -> Lead:
            now = time.time()
            row = db.execute("SELECT holder, until, state, state_at FROM leads WHERE id=?", (self.id,)).fetchone()
            held, until, published, at = row if row else (None, 0.0, None, 0.0)
            if held is None or held == holder or until < now or until > now + 2 * LEASE_SECONDS:
                if state is not None:
                    published, at = state, now
                held, until = (None, 0.0) if release else (holder, now + LEASE_SECONDS)
                db.execute("INSERT OR REPLACE INTO leads VALUES (?, ?, ?, ?, ?)", (self.id, held, until, published, at))
            return Lead(held, published if now - at <= SHARED_SECONDS else None, at, now)

        return await self._transaction(step)

    async def quota_claim(
        self, periods: Sequence[tuple[str, float]], limit: int | None, epoch: str | None = None
    ) -> QuotaCounts:
        def claim(db: sqlite3.Connection) -> QuotaCounts:
            if epoch is not None and epoch != self.epoch:
                raise BudgetReset(self.epoch)
            return QuotaCounts(self.epoch, *_quota_claim(db, self.id, periods, limit))

        return await self._transaction(claim)

    async def quota_restore(self, into: str, old: str, counts: Sequence[tuple[str, int, float]]) -> None:
        def restore(db: sqlite3.Connection) -> None:
            if into != self.epoch:
                raise BudgetReset(self.epoch)
            _quota_restore(db, self.id, old, counts)

        await self._transaction(restore)

    async def quota_give_back(self, periods: Sequence[str]) -> None:
        await self._transaction(lambda db: db.executemany(_GIVE_BACK, [(self.id, name) for name in periods]))

    async def quota_used(self, period: str) -> int:
        return await self._transaction(lambda db: _quota_used(db, self.id, period)) if self.path.exists() else 0

    async def look(self) -> Slot:
        if not self.path.exists():
            return State().slot(time.time(), Step(None), 0, 0, 0)
        return await self.reserve(0.0, start=False)


def _runs(db: sqlite3.Connection, key_id: str) -> list[RunEntry]:
    """The key's runs whose entries have not lapsed."""
    now = time.time()
    rows = db.execute(
        "SELECT run_id, member, entry, seen FROM runs WHERE id=? AND seen >= ? ORDER BY run_id, member",
        (key_id, now - RUN_LEASE_SECONDS),
    ).fetchall()
    found = (RunEntry.read(run_id, member, entry, seen, now) for run_id, member, entry, seen in rows)
    return [entry for entry in found if entry is not None]


def _registry_step(db: sqlite3.Connection, key_id: str, now: float, report: Report) -> str | None:
    """The report's entry kept (lapsed ones dropped); the calling run's job's stop, if any."""
    if report.run is None:
        return None
    if report.entry is not None and len(report.entry) <= ENTRY_CHARS:
        db.execute(
            "INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?)",
            (key_id, report.run.member, report.run.run_id, report.entry, now),
        )
        db.execute("DELETE FROM runs WHERE id=? AND seen < ?", (key_id, now - RUN_LEASE_SECONDS))
    row = db.execute("SELECT cause FROM stops WHERE id=? AND run_id=?", (key_id, report.run.run_id)).fetchone()
    return str(row[0]) if row else None


_GIVE_BACK = "UPDATE quota_counts SET used = MAX(0, used - 1) WHERE id=? AND period=?"


def _quota_used(db: sqlite3.Connection, key_id: str, period: str) -> int:
    row = db.execute("SELECT used FROM quota_counts WHERE id=? AND period=?", (key_id, period)).fetchone()
    return int(row[0]) if row else 0


def _quota_claim(
    db: sqlite3.Connection, key_id: str, periods: Sequence[tuple[str, float]], limit: int | None
) -> tuple[tuple[int, ...], bool]:
    """One more request counted in each of ``periods`` (each kept its seconds) unless the first holds
    ``limit``: each period's count after it, and whether it counted."""
    counted = limit is None or _quota_used(db, key_id, periods[0][0]) < limit
    if counted:
        now = time.time()
        db.executemany(
            "INSERT INTO quota_counts VALUES (?, ?, 1, ?) ON CONFLICT (id, period) DO UPDATE SET used = used + 1",
            [(key_id, name, now + keep) for name, keep in periods],
        )
        db.execute("DELETE FROM quota_counts WHERE expires < ?", (now,))
    return tuple(_quota_used(db, key_id, name) for name, _ in periods), counted


def _quota_restore(db: sqlite3.Connection, key_id: str, old: str, counts: Sequence[tuple[str, int, float]]) -> None:
    """What a run saw counted on the old epoch ``old`` added to each period's count, beyond what was
    restored of that epoch already (the table ``quota_restored``: each old epoch once, the most seen)."""
    now = time.time()
    for name, count, keep in counts:
        row = db.execute(
            "SELECT used FROM quota_restored WHERE id=? AND epoch=? AND period=?", (key_id, old, name)
        ).fetchone()
        done = int(row[0]) if row else 0
        if count > done:
            db.execute(
                "INSERT INTO quota_counts VALUES (?, ?, ?, ?) ON CONFLICT (id, period) DO UPDATE SET "
                "used = used + excluded.used, expires = MAX(expires, excluded.expires)",
                (key_id, name, count - done, now + keep),
            )
            db.execute(
                "INSERT OR REPLACE INTO quota_restored VALUES (?, ?, ?, ?, ?)", (key_id, old, name, count, now + keep)
            )
    db.execute("DELETE FROM quota_restored WHERE expires < ?", (now,))
