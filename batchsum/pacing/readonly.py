"""Reading every key's budget in a place without writing it (``read_states``): what each holds now
(``KeyState``), from the SQLite file opened read-only beside the processes writing it, or from Redis
by one read-only Lua script per key, whatever the number of runs on it.

Invariant: reading creates, changes and locks nothing a writer needs. A SQLite file with a write-ahead
log (a run has it open) is read through that log with ``mode=ro``, which reads the log's index even
where it may not write it; a file without one (no run has it open: everything is in the file) is read
as ``immutable``, which opens no log (it would have to make one), and read again if the file changed
meanwhile. A budget not made yet is no keys.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..service.errors import BudgetError, location_secrets, one_line, redact, redact_location
from ..service.keys import PERIODS, period_window
from ..service.location import BUDGET, Location
from .exchange import RECORD_SECONDS, RUN_LEASE_SECONDS, SHARED_SECONDS, Remembered, RunEntry
from .ledger import Ledger, Tally, tick_of
from .redis_scripts import live_runs, ticks

__all__ = ["KeyState", "read_states", "read_sqlite", "read_redis", "VIEW_SCRIPT"]

_READS = 3  # a file read as immutable that changed under the read is read again, up to this often


@dataclass(frozen=True)
class KeyState:
    """One key's budget as read (``id``: the budget's, a hash of base URL and key), named by the key's
    short hash at its service: the budget's clock (``now``, Unix time), its shared pause and pace, its
    ledger of the last seconds asked, the live runs' entries, the lead of its search (``lead_until``;
    its published state while fresh), the paid requests counted in each period now (``paid``: hour,
    day, month) and what is remembered of the key at the service."""

    id: str
    key_hash: str
    service: str
    now: float
    paused_until: float = 0.0
    pause_reason: str | None = None
    pace: float | None = None
    ledger: Ledger = field(default_factory=lambda: Ledger.empty(0.0))
    runs: tuple[RunEntry, ...] = ()
    lead_until: float = 0.0
    lead_state: str | None = None
    paid: dict[str, int] = field(default_factory=dict)
    remembered: tuple[Remembered, ...] = ()


def _periods(wall: float) -> dict[str, str]:
    """Each quota period (hour, day, month) -> its name now (``day:2026-11-27``), as runs count them."""
    return {period: period_window(period, wall)[0] for period in PERIODS}


async def read_states(where: Location | str, seconds: float = 70.0) -> list[KeyState]:
    """Every key named on the budget ``where`` (a file's or a Redis'; a text is parsed as ``--budget``'s)
    with its ledger of the last ``seconds``; nothing for a budget not made yet. ``BudgetError``: unreadable."""
    place = Location.of(where, BUDGET)
    if place.redis:
        return await read_redis(place.url, seconds)
    path = place.file
    if path is None:
        raise BudgetError(f"the budget {place.shown!r} lives inside each run's process: nothing outside reads it")
    return read_sqlite(path, seconds)


# -- SQLite ------------------------------------------------------------------------------------------


def _identity(path: Path) -> tuple[int, int, int]:
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def read_sqlite(path: Path, seconds: float) -> list[KeyState]:
    """The keys of the budget file ``path`` (see the module's invariant for how it is opened)."""
    path = path.absolute()
    uri = "file://" + quote(str(path))  # an empty authority: the path may begin with //
    for _ in range(_READS):
        if not path.exists():
            return []
        logged = Path(f"{path}-wal").exists()
        try:
            before = None if logged else _identity(path)
            db = sqlite3.connect(f"{uri}?mode=ro" + ("" if logged else "&immutable=1"), uri=True, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise _unreadable(path, exc) from None
        try:
            states = _query(db, seconds)
        except sqlite3.DatabaseError as exc:
            if logged:
                raise _unreadable(path, exc) from None
            continue  # a file changed under an immutable read can read as damaged: read it again
        finally:
            db.close()
        try:
            if before is None or _identity(path) == before:
                return states
        except OSError:
            return []  # removed meanwhile (``limits --forget`` leaves the file; a person may not)
    raise _unreadable(path, "it kept changing while read")


def _unreadable(path: Path, problem: object) -> BudgetError:
    said = getattr(problem, "strerror", None) or problem
    return BudgetError(f"cannot read the rate budget at {path}: {said}")


def _query(db: sqlite3.Connection, seconds: float) -> list[KeyState]:
    """Every named key's state, in one read transaction (one moment of the file)."""
    db.execute("PRAGMA query_only=1")
    db.execute("BEGIN")
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        now = time.time()

        def rows(table: str, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
            return db.execute(sql, tuple(args)).fetchall() if table in tables else []

        names = rows("names", "SELECT id, key_hash, service FROM names ORDER BY key_hash, service")
        state = {r[0]: r[1:] for r in rows("budgets", "SELECT id, paused_until, reason, pace, pace_at FROM budgets")}
        ticks: dict[str, list[Tally]] = {}
        for key_id, *counts in rows(
            "tallies",
            "SELECT id, tick, starts, answered, refused FROM tallies WHERE tick >= ?",
            [tick_of(now - seconds)],
        ):
            ticks.setdefault(key_id, []).append(Tally(*counts))
        runs: dict[str, list[RunEntry]] = {}
        for key_id, member, run_id, text, seen in rows(
            "runs",
            "SELECT id, member, run_id, entry, seen FROM runs WHERE seen >= ? ORDER BY run_id, member",
            [now - RUN_LEASE_SECONDS],
        ):
            if (entry := RunEntry.read(run_id, member, text, seen, now)) is not None:
                runs.setdefault(key_id, []).append(entry)
        leads = {r[0]: r[1:] for r in rows("leads", "SELECT id, until, state, state_at FROM leads")}
        periods = _periods(now)
        paid: dict[str, dict[str, int]] = {}
        named = {name: period for period, name in periods.items()}
        for key_id, name, used in rows(
            "quota_counts",
            f"SELECT id, period, used FROM quota_counts WHERE period IN ({', '.join('?' * len(named))})",
            named,
        ):
            paid.setdefault(key_id, {})[named[name]] = int(used)
        remembered: dict[tuple[str, str], list[Remembered]] = {}
        for row in rows(
            "remembered",
            "SELECT key_hash, service, name, value, at FROM remembered WHERE at >= ?",
            [now - RECORD_SECONDS],
        ):
            remembered.setdefault((row[0], row[1]), []).append(Remembered(*row))
    finally:
        db.execute("COMMIT")
    out = []
    for key_id, key_hash, service in names:
        paused_until, reason, pace, pace_at = state.get(key_id, (0.0, None, None, 0.0))
        until, lead_state, state_at = leads.get(key_id, (0.0, None, 0.0))
        out.append(
            KeyState(
                id=key_id,
                key_hash=key_hash,
                service=service,
                now=now,
                paused_until=float(paused_until or 0.0),
                pause_reason=reason or None,
                pace=float(pace) if pace is not None and now - float(pace_at or 0.0) <= SHARED_SECONDS else None,
                ledger=Ledger.of(now, ticks.get(key_id, []), seconds),
                runs=tuple(runs.get(key_id, ())),
                lead_until=float(until or 0.0),
                lead_state=lead_state if lead_state and now - float(state_at or 0.0) <= SHARED_SECONDS else None,
                paid=paid.get(key_id, {}),
                remembered=tuple(remembered.get((key_hash, service), ())),
            )
        )
    return out


# -- Redis -------------------------------------------------------------------------------------------

_NAMES = "batchsum:budget:names"  # budget id -> "KEY_HASH SERVICE" (written by each run's recall)
_REMEMBERED = "batchsum:remembered:"  # + KEY_HASH:SERVICE -> name -> "AT VALUE"

# One key's budget read at once, writing nothing (Redis 7 refuses a write in a script flagged
# no-writes). KEYS: the budget's hash, its counts' prefix, the runs' hash and their seen set, the lead,
# then the quota counts of the periods now. ARGV: the runs' lease, the seconds of ledger. Returns now;
# the pause, its reason, the pace and when it was written; the ledger's ticks (tick, starts, answered,
# refused); the live runs (member, "SEEN RUN_ID ENTRY"); the lead's until, state and state_at; the counts.
VIEW_SCRIPT = (
    """#!lua flags=no-writes
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local s = redis.call('HMGET', KEYS[1], 'paused_until', 'reason', 'pace', 'pace_at')
local state = {}
for i = 1, 4 do state[i] = s[i] or '' end
local ticks = {}
"""
    + ticks("KEYS[2]", "ARGV[2]", "ticks")
    + "local runs = {}\n"
    + live_runs("KEYS[3]", "KEYS[4]", "ARGV[1]", "runs")
    + """local l = redis.call('HMGET', KEYS[5], 'until', 'state', 'state_at')
local lead = {l[1] or '0', l[2] or '', l[3] or '0'}
local counts = {}
for i = 6, #KEYS do table.insert(counts, redis.call('GET', KEYS[i]) or '0') end
return {string.format('%.6f', now), state, ticks, runs, lead, counts}
"""
)
_UNFLAGGED = VIEW_SCRIPT.split("\n", 1)[1]  # Redis before 7 reads no flags (the script writes nothing either way)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def read_redis(url: str, seconds: float) -> list[KeyState]:
    """The keys named on the Redis budget at ``url`` (as its client reads it: no prefix): the names,
    then one pipeline of one script and the remembered entries per key (three round trips at most,
    whatever the number of runs)."""
    try:
        import redis.asyncio
        import redis.exceptions
    except ImportError:
        raise BudgetError("a redis:// budget needs the redis package: pip install 'batchsum[redis]'") from None
    client = redis.asyncio.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
    try:
        names = sorted(
            (_text(v).partition(" ")[0], _text(v).partition(" ")[2], _text(k))
            for k, v in (await client.hgetall(_NAMES)).items()
        )
        if not names:
            return []
        periods = _periods(time.time())
        try:
            raw = await _pipeline(client, names, periods, seconds, VIEW_SCRIPT)
        except redis.exceptions.ResponseError:
            raw = await _pipeline(client, names, periods, seconds, _UNFLAGGED)
    except (redis.exceptions.RedisError, OSError) as exc:
        said = redact(redact_location(one_line(exc)), location_secrets(url))
        raise BudgetError(f"cannot read the rate budget at {redact_location(url)}: {said}") from None
    finally:
        await client.aclose()
    return [
        _redis_state(key_id, key_hash, service, periods, seconds, *pair)
        for (key_hash, service, key_id), pair in zip(names, zip(raw[0::2], raw[1::2]))
    ]


async def _pipeline(
    client: Any, names: list[tuple[str, str, str]], periods: dict[str, str], seconds: float, script: str
) -> list[Any]:
    async with client.pipeline(transaction=False) as pipe:
        for key_hash, service, key_id in names:
            budget = f"batchsum:budget:{{{key_id}}}"
            keys = [
                budget,
                f"{budget}:counts",
                f"{budget}:runs",
                f"{budget}:runs:seen",
                f"{budget}:lead",
                *(f"{budget}:quota:{name}" for name in periods.values()),
            ]
            pipe.eval(script, len(keys), *keys, str(RUN_LEASE_SECONDS), str(seconds))
            pipe.hgetall(f"{_REMEMBERED}{key_hash}:{service}")
        return list(await pipe.execute())


def _redis_state(
    key_id: str, key_hash: str, service: str, periods: dict[str, str], seconds: float, view: Any, record: Any
) -> KeyState:
    now_text, state, ticks, runs, lead, counts = view
    now = float(_text(now_text))
    paused_until, reason, pace, pace_at = (_text(v) for v in state)
    ticks = [int(_text(v)) for v in ticks]
    tallies = [Tally(*ticks[i : i + 4]) for i in range(0, len(ticks) - 3, 4)]
    entries = []
    for member, value in zip(runs[0::2], runs[1::2]):
        seen, run_id, text = (_text(value).split(" ", 2) + ["", ""])[:3]
        try:
            entry = RunEntry.read(run_id, _text(member), text, float(seen), now)
        except ValueError:
            continue
        if entry is not None:
            entries.append(entry)
    until, lead_state, state_at = (_text(v) for v in lead)
    remembered = []
    for name, value in (record or {}).items():
        at, _, text = _text(value).partition(" ")
        try:
            stamp = float(at)
        except ValueError:
            continue
        if stamp >= time.time() - RECORD_SECONDS:
            remembered.append(Remembered(key_hash, service, _text(name), text, stamp))
    return KeyState(
        id=key_id,
        key_hash=key_hash,
        service=service,
        now=now,
        paused_until=float(paused_until or 0.0),
        pause_reason=reason or None,
        pace=float(pace) if pace and now - float(pace_at or 0.0) <= SHARED_SECONDS else None,
        ledger=Ledger.of(now, tallies, seconds),
        runs=tuple(sorted(entries, key=lambda e: (e.run_id, e.member))),
        lead_until=float(until or 0.0),
        lead_state=lead_state if lead_state and now - float(state_at or 0.0) <= SHARED_SECONDS else None,
        paid={period: int(_text(count)) for period, count in zip(periods, counts) if int(_text(count))},
        remembered=tuple(sorted(remembered, key=lambda e: e.name)),
    )
