"""Reading every key's budget in a place without writing it (``read_states``): what each holds now
(``KeyState``), from the SQLite file opened read-only beside the processes writing it, or from Redis
in plain reads (no script, no ``TIME``: a user with ``+@read`` alone may read it), pipelined whatever
the number of runs. Each back-end reads only its stored values (``Stored``); one function turns them
into the key's state (``key_state``), the same way for both.

Invariant: reading creates, changes and locks nothing a writer needs. A SQLite file with a write-ahead
log (a run has it open) is read through that log with ``mode=ro``, which reads the log's index even
where it may not write it; a file without one (no run has it open: everything is in the file) is read
as ``immutable``, which opens no log (it would have to make one), and read again if the file changed
meanwhile. A budget not made yet is no keys.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ...service.errors import BudgetError, location_secrets, one_line, redact, redact_location
from ...service.key_plans import PERIODS, period_window
from ...service.location import BUDGET, Location
from ..budgets.exchange import RECORD_SECONDS, RUN_LEASE_SECONDS, SHARED_SECONDS, Remembered, RunEntry
from ..budgets.ledger import TICK, Ledger, Tally, tick_of

__all__ = ["KeyState", "Stored", "key_state", "read_states", "read_sqlite", "read_redis"]

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


@dataclass(frozen=True)
class Stored:
    """One key's values as a budget stores them, read at one moment (``now``: the budget's clock),
    each as the back-end holds it (text or number, empty or None where unset): the pause (until,
    reason) and the shared pace (and when it was written), the ledger's tallies, the runs' entries (member,
    run id, entry, seen), the lead (until, state, when the state was written), the quota counts of the
    periods now (hour, day, month) and the remembered entries."""

    id: str
    key_hash: str
    service: str
    now: float
    pause_and_pace: Sequence[Any] = (None, None, None, None)  # paused until, its reason, the pace, its time
    tallies: Sequence[Tally] = ()
    runs: Sequence[tuple[str, str, str, float]] = ()
    lead: Sequence[Any] = (None, None, None)
    counts: Mapping[str, Any] = field(default_factory=dict)
    remembered: Sequence[Remembered] = ()


def _number(value: Any) -> float | None:
    """A stored number (text, bytes or a number), or None where unset or unreadable."""
    if isinstance(value, bytes):
        value = value.decode()
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _words(value: Any) -> str | None:
    """A stored text, or None where unset."""
    if isinstance(value, bytes):
        value = value.decode()
    return str(value) if value not in (None, "") else None


def key_state(stored: Stored, seconds: float) -> KeyState:
    """The key's state from what its budget stores (either back-end): a shared pace and a search's
    state while fresh (``SHARED_SECONDS``), the runs seen within their lease, the ledger of the last
    ``seconds``, the periods' counts above nought, the remembered entries younger than a week."""
    now = stored.now

    def fresh(at: Any) -> bool:
        return now - (_number(at) or 0.0) <= SHARED_SECONDS

    paused_until, reason, pace_text, pace_at = stored.pause_and_pace
    pace = _number(pace_text)
    until, lead_state, state_at = stored.lead
    runs = (
        RunEntry.read(run_id, member, text, seen, now)
        for member, run_id, text, seen in stored.runs
        if seen >= now - RUN_LEASE_SECONDS
    )
    return KeyState(
        id=stored.id,
        key_hash=stored.key_hash,
        service=stored.service,
        now=now,
        paused_until=_number(paused_until) or 0.0,
        pause_reason=_words(reason),
        pace=pace if pace is not None and fresh(pace_at) else None,
        ledger=Ledger.of(now, list(stored.tallies), seconds),
        runs=tuple(sorted((entry for entry in runs if entry is not None), key=lambda e: (e.run_id, e.member))),
        lead_until=_number(until) or 0.0,
        lead_state=_words(lead_state) if fresh(state_at) else None,
        paid={period: used for period, count in stored.counts.items() if (used := int(_number(count) or 0))},
        remembered=tuple(sorted((e for e in stored.remembered if e.at >= now - RECORD_SECONDS), key=lambda e: e.name)),
    )


def _periods(wall: float) -> dict[str, str]:
    """Each quota period (hour, day, month) -> its name now (``day:2026-11-27``), as runs count them."""
    return {period: period_window(period, wall)[0] for period in PERIODS}


async def read_states(where: Location | str, seconds: float = 70.0) -> list[KeyState]:
    """Every key named on the budget ``where`` (a file's or a Redis'; a text is parsed as ``--budget``'s)
    with its ledger of the last ``seconds``; nothing for a budget not made yet. ``BudgetError``: unreadable."""
    place = Location.of(where, BUDGET)
    if place.redis:
        stored = await read_redis(place.url, seconds)
    else:
        path = place.file
        if path is None:
            raise BudgetError(f"the budget {place.shown!r} lives inside each run's process: nothing outside reads it")
        stored = read_sqlite(path, seconds)
    return [key_state(one, seconds) for one in stored]


# -- SQLite ------------------------------------------------------------------------------------------


def _identity(path: Path) -> tuple[int, int, int]:
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def read_sqlite(path: Path, seconds: float) -> list[Stored]:
    """What the budget file ``path`` stores of each key (see the module's invariant for how it is opened)."""
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
            stored = _query(db, seconds)
        except sqlite3.DatabaseError as exc:
            if logged:
                raise _unreadable(path, exc) from None
            continue  # a file changed under an immutable read can read as damaged: read it again
        finally:
            db.close()
        try:
            if before is None or _identity(path) == before:
                return stored
        except OSError:
            return []  # removed meanwhile (``limits --forget`` leaves the file; a person may not)
    raise _unreadable(path, "it kept changing while read")


def _unreadable(path: Path, problem: object) -> BudgetError:
    said = getattr(problem, "strerror", None) or problem
    return BudgetError(f"cannot read the rate budget at {path}: {said}")


def _query(db: sqlite3.Connection, seconds: float) -> list[Stored]:
    """What the file stores of every named key, in one read transaction (one moment of the file)."""
    db.execute("PRAGMA query_only=1")
    db.execute("BEGIN")
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        now = time.time()

        def rows(table: str, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
            return db.execute(sql, tuple(args)).fetchall() if table in tables else []

        def by_key(found: list[tuple[Any, ...]]) -> dict[Any, list[tuple[Any, ...]]]:
            out: dict[Any, list[tuple[Any, ...]]] = {}
            for row in found:
                out.setdefault(row[0], []).append(row[1:])
            return out

        names = rows("names", "SELECT id, key_hash, service FROM names ORDER BY key_hash, service")
        state = {r[0]: r[1:] for r in rows("budgets", "SELECT id, paused_until, reason, pace, pace_at FROM budgets")}
        tallies = by_key(
            rows(
                "tallies",
                "SELECT id, tick, starts, answered, refused FROM tallies WHERE tick >= ?",
                [tick_of(now - seconds)],
            )
        )
        runs = by_key(
            rows("runs", "SELECT id, member, run_id, entry, seen FROM runs WHERE seen >= ?", [now - RUN_LEASE_SECONDS])
        )
        leads = {r[0]: r[1:] for r in rows("leads", "SELECT id, until, state, state_at FROM leads")}
        named = {name: period for period, name in _periods(now).items()}
        counts = by_key(
            rows(
                "quota_counts",
                f"SELECT id, period, used FROM quota_counts WHERE period IN ({', '.join('?' * len(named))})",
                named,
            )
        )
        remembered = by_key(
            rows(
                "remembered",
                "SELECT key_hash || ' ' || service, key_hash, service, name, value, at FROM remembered WHERE at >= ?",
                [now - RECORD_SECONDS],
            )
        )
    finally:
        db.execute("COMMIT")
    return [
        Stored(
            key_id,
            key_hash,
            service,
            now,
            state.get(key_id, (None, None, None, None)),
            tallies=[Tally(*row) for row in tallies.get(key_id, [])],
            runs=[(member, run_id, entry, float(seen)) for member, run_id, entry, seen in runs.get(key_id, [])],
            lead=leads.get(key_id, (None, None, None)),
            counts={named[name]: used for name, used in counts.get(key_id, [])},
            remembered=[Remembered(*row) for row in remembered.get(f"{key_hash} {service}", [])],
        )
        for key_id, key_hash, service in names
    ]


# -- Redis -------------------------------------------------------------------------------------------
# Plain reads of what the budget's scripts write (``redis_scripts.STEP``): no script and no ``TIME``,
# so that a user with ``+@read`` alone (a monitoring account) reads what any other does. The budget's
# clock is Redis' own, read as the expiry of a key's budget hash (``PEXPIRETIME``, which every step
# sets) less what is left of it (``PTTL``); where no hash says it (none stepped for a day, Redis
# before 7), this machine's.

_NAMES = "batchsum:budget:names"  # budget id -> "KEY_HASH SERVICE" (written by each run's recall)
_REMEMBERED = "batchsum:remembered:"  # + KEY_HASH:SERVICE -> name -> "AT VALUE"
_PER_SECOND = round(1 / TICK)  # a second's hash of counts holds its ticks' as s0..s9, a0..a9, r0..r9


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _budget(key_id: str) -> str:
    return f"batchsum:budget:{{{key_id}}}"


async def read_redis(url: str, seconds: float) -> list[Stored]:
    """What the Redis budget at ``url`` stores of each named key, in three round trips whatever the
    number of keys and runs: the names, the clock, then one pipeline of every key's reads."""
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
        now = await _clock(client, [key_id for _, _, key_id in names])
        return await _read_keys(client, names, now, seconds)
    except (redis.exceptions.RedisError, OSError) as exc:
        said = redact(redact_location(one_line(exc)), location_secrets(url))
        raise BudgetError(f"cannot read the rate budget at {redact_location(url)}: {said}") from None
    finally:
        await client.aclose()


async def _clock(client: Any, key_ids: list[str]) -> float:
    """Redis' clock (Unix time): a key's budget hash's expiry less what is left of it, to the
    millisecond; this machine's where no hash says it."""
    async with client.pipeline(transaction=False) as pipe:
        for key_id in key_ids:
            pipe.pexpiretime(_budget(key_id))
            pipe.pttl(_budget(key_id))
        said = await pipe.execute(raise_on_error=False)
    for expires, left in zip(said[0::2], said[1::2]):
        if isinstance(expires, int) and isinstance(left, int) and expires > 0 and left >= 0:
            return (expires - left) / 1000
    return time.time()


async def _read_keys(client: Any, names: list[tuple[str, str, str]], now: float, seconds: float) -> list[Stored]:
    """One pipeline of every key's reads: its pause and pace, runs, lead, quota counts of the periods
    now, remembered entries, then the hash of counts of each second of its ledger."""
    periods = _periods(now)
    ledger = range(math.floor(now - seconds), math.floor(now) + 1)
    async with client.pipeline(transaction=False) as pipe:
        for key_hash, service, key_id in names:
            budget = _budget(key_id)
            pipe.hmget(budget, ["paused_until", "reason", "pace", "pace_at"])
            pipe.hgetall(f"{budget}:runs")
            pipe.hmget(f"{budget}:lead", ["until", "state", "state_at"])
            pipe.mget([f"{budget}:quota:{name}" for name in periods.values()])
            pipe.hgetall(f"{_REMEMBERED}{key_hash}:{service}")
            for second in ledger:
                pipe.hgetall(f"{budget}:counts:{second}")
        raw = await pipe.execute()
    size = 5 + len(ledger)
    out = []
    for n, (key_hash, service, key_id) in enumerate(names):
        state, runs, lead, counts, remembered, *hashes = raw[n * size : (n + 1) * size]
        out.append(
            Stored(
                key_id,
                key_hash,
                service,
                now,
                state,
                tallies=[tally for second, counts_of in zip(ledger, hashes) for tally in _ticks(second, counts_of)],
                runs=_runs(runs),
                lead=lead,
                counts=dict(zip(periods, counts)),
                remembered=_remembered(key_hash, service, remembered),
            )
        )
    return out


def _ticks(second: int, counts: Mapping[Any, Any]) -> list[Tally]:
    """The ticks of one second's hash of counts, as ``redis_scripts.ticks`` reads them: (tick, starts,
    answered, refused) for each tenth with any."""
    fields = {_text(name): int(_text(value)) for name, value in counts.items()}
    out = []
    for d in range(_PER_SECOND):
        starts, answered, refused = (fields.get(f"{kind}{d}") for kind in "sar")
        if starts is not None or answered is not None or refused is not None:
            out.append(Tally(second * _PER_SECOND + d, starts or 0, answered or 0, refused or 0))
    return out


def _runs(entries: Mapping[Any, Any]) -> list[tuple[str, str, str, float]]:
    """The runs' hash (member -> "SEEN RUN_ID ENTRY") as (member, run id, entry, seen)."""
    out = []
    for member, value in entries.items():
        seen, run_id, text = (_text(value).split(" ", 2) + ["", ""])[:3]
        try:
            out.append((_text(member), run_id, text, float(seen)))
        except ValueError:
            continue
    return out


def _remembered(key_hash: str, service: str, entries: Mapping[Any, Any]) -> list[Remembered]:
    """The remembered hash (name -> "AT VALUE") as entries; an unreadable one left out."""
    out = []
    for name, value in entries.items():
        at, _, text = _text(value).partition(" ")
        try:
            out.append(Remembered(key_hash, service, _text(name), text, float(at)))
        except ValueError:
            continue
    return out
