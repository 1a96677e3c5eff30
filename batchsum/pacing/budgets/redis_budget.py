"""``RedisBudget``: a key's budget shared by every process on every machine, GCRA in one Lua script on
Redis' own clock, with the entries remembered of each key. A far budget (``Budget.far``): pacers
reserve their next starts ahead, a few in one call. A Redis that stops answering mid-run is waited
for (``outage.Outage``), not a stop, until the run's ``budget_wait``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from ...service.errors import BudgetError, location_secrets, one_line, redact, redact_location
from ...service.location import BUDGET, Location
from .exchange import (
    AHEAD,
    ENTRY_CHARS,
    LEASE_SECONDS,
    RECORD_SECONDS,
    RESERVE,
    RESERVE_ONLY,
    RUN_LEASE_SECONDS,
    SETTING,
    SHARED_SECONDS,
    STOP_SECONDS,
    Budget,
    BudgetReset,
    BudgetUnreachable,
    Lead,
    Member,
    QuotaCounts,
    Remembered,
    Report,
    RunEntry,
    Share,
    Slot,
)
from .gcra import KEEP_SECONDS, LIVE_LEASE, LIVE_SLACK, MAX_AHEAD, MAX_PAUSE, MINUTE, ON_TIME, QUEUE_MOST, REASON_CHARS
from .ledger import LEDGER_SECONDS, TICK, Ledger, Tally
from .outage import hurried
from .redis_scripts import GIVE_BACK, LEAD, LEDGER, QUOTA, RESTORE, REWRITE, RUNS, STEP

__all__ = ["RedisBudget"]

T = TypeVar("T")


_REDIS_ATTEMPTS = 3
_REMEMBERED = "batchsum:remembered:"  # + KEY_HASH:SERVICE -> a hash of name -> "AT VALUE"
_NAMES = "batchsum:budget:names"  # a hash of budget id -> "KEY_HASH SERVICE"


def _decode_entries(key_hash: str, service: str, raw: dict[Any, Any]) -> list[Remembered]:
    """A remembered hash's fields as entries, the old and the unreadable left out."""
    oldest = time.time() - RECORD_SECONDS
    out = []
    for field_name, field_value in raw.items():
        name = field_name.decode() if isinstance(field_name, bytes) else str(field_name)
        text = field_value.decode() if isinstance(field_value, bytes) else str(field_value)
        at, _, value = text.partition(" ")
        try:
            stamp = float(at)
        except ValueError:
            continue
        if stamp >= oldest:
            out.append(Remembered(key_hash, service, name, value, stamp))
    return sorted(out, key=lambda e: e.name)


class _RedisConnection(Budget):
    """A budget's Redis: a connection per event loop (made in the loop that first uses it), commands
    tried again when the connection fails, and the entries remembered of each key there."""

    def __init__(self, url: Location | str, key_id: str) -> None:
        try:
            import redis.asyncio  # noqa: F401
        except ImportError:
            raise BudgetError("a redis:// budget needs the redis package: pip install 'batchsum[redis]'") from None
        self.location = Location.of(url, BUDGET)  # whole: a store that follows the budget takes its prefix
        self.url = self.location.text
        self._bare = self.location.url  # the budget is never prefixed: a key's limit is the key's
        self.id = key_id
        self.where = self.location.shown
        self._secrets = location_secrets(self.url)
        self._keys = [f"batchsum:budget:{{{key_id}}}", f"batchsum:budget:{{{key_id}}}:counts"]
        self._clients: dict[int, Any] = {}

    def _client(self) -> Any:
        import asyncio

        import redis.asyncio

        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            client = redis.asyncio.Redis.from_url(
                self._bare, socket_connect_timeout=5, socket_timeout=10, health_check_interval=30
            )
            entry = (loop, client, client.register_script(STEP))  # the budget's step, loaded once a connection
            self._clients[id(loop)] = entry
        return entry

    async def _redis(self, command: Callable[[], Awaitable[T]]) -> T:
        """``command`` on the budget's Redis, through its outage: while it cannot be reached, tried
        again with a backoff up to the run's ``budget_wait`` (``outage.Outage``)."""
        return await self.outage.through(lambda: self._tries(command))

    async def _tries(self, command: Callable[[], Awaitable[T]]) -> T:
        """``command``, tried up to three times when the connection fails (``BudgetUnreachable``)."""
        import asyncio

        import redis.exceptions

        attempts = 1 if self.outage.since is not None else _REDIS_ATTEMPTS  # out: the outage's backoff tries again
        for attempt in range(attempts):
            try:
                return await command()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
                if attempt == attempts - 1:
                    said, advice = _said(exc, self._secrets), f"start it, or set {SETTING} to machine or none"
                    raise BudgetUnreachable(
                        f"cannot reach the rate budget at {self.where} ({said}) after {attempts} tries; {advice}",
                        cause=said,
                        advice=advice,
                    ) from None
                await asyncio.sleep(0.2 * 2**attempt)
            except redis.exceptions.RedisError as exc:
                raise BudgetError(f"the rate budget at {self.where} refused: {_said(exc, self._secrets)}") from None
        raise AssertionError("unreachable")

    def _eval(self, script: str, keys: Sequence[str], args: Sequence[str]) -> Callable[[], Awaitable[Any]]:
        """A call of ``script`` on ``keys`` and ``args``, to make (and make again) on the loop's connection."""
        return lambda: self._client()[1].eval(script, len(keys), *keys, *args)

    def _record_key(self, key_hash: str, service: str) -> str:
        return f"{_REMEMBERED}{key_hash}:{service}"

    async def recall(self, key_hash: str, service: str) -> list[Remembered]:
        _, client, _ = self._client()

        async def read() -> Any:
            async with client.pipeline(transaction=False) as pipe:
                pipe.hset(_NAMES, self.id, f"{key_hash} {service}")  # which budget is this key's (forget)
                pipe.hgetall(self._record_key(key_hash, service))
                return (await pipe.execute())[1]

        return _decode_entries(key_hash, service, await self._redis(read))

    async def remember(self, key_hash: str, service: str, entries: dict[str, str]) -> None:
        _, client, _ = self._client()
        key, now = self._record_key(key_hash, service), time.time()

        async def write() -> None:
            async with client.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping={name: f"{now:.6f} {value}" for name, value in entries.items()})
                pipe.expire(key, int(RECORD_SECONDS))
                await pipe.execute()

        await self._redis(write)

    async def remembered(self) -> list[Remembered]:
        _, client, _ = self._client()

        async def scan() -> list[Remembered]:
            out: list[Remembered] = []
            async for raw_key in client.scan_iter(match=f"{_REMEMBERED}*", count=500):
                name = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
                key_hash, _, service = name[len(_REMEMBERED) :].partition(":")
                out.extend(_decode_entries(key_hash, service, await client.hgetall(name)))
            return sorted(out, key=lambda e: (e.service, e.key_hash, e.name))

        return await self._redis(scan)

    async def forget(self, key_hash: str | None = None, service: str | None = None, name: str | None = None) -> int:
        _, client, _ = self._client()
        wanted = {"key_hash": key_hash, "service": service, "name": name}
        matching = [
            entry
            for entry in await self.remembered()
            if all(value is None or getattr(entry, field) == value for field, value in wanted.items())
        ]

        async def delete() -> int:
            ids = []
            if name is None:  # the keys' shared pace, counts and search go with what is remembered
                for raw_id, raw_name in (await client.hgetall(_NAMES)).items():
                    hashed, _, named = _text(raw_name).partition(" ")
                    if key_hash in (None, hashed) and service in (None, named):
                        ids.append(_text(raw_id))
            async with client.pipeline(transaction=False) as pipe:
                for entry in matching:
                    pipe.hdel(self._record_key(entry.key_hash, entry.service), entry.name)
                for key_id in ids:
                    pipe.hdel(f"batchsum:budget:{{{key_id}}}", "pace", "pace_at")
                    for part in ("lead", "runs", "runs:seen"):
                        pipe.delete(f"batchsum:budget:{{{key_id}}}:{part}")
                gone = sum(int(n) for n in (await pipe.execute())[: len(matching)])
            for key_id in ids:
                for part in ("counts", "stop"):
                    async for found in client.scan_iter(match=f"batchsum:budget:{{{key_id}}}:{part}:*", count=500):
                        await client.delete(found)
            return gone

        return await self._redis(delete) if matching or name is None else 0

    async def aclose(self) -> None:
        import asyncio

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        entry = self._clients.pop(id(loop), None)
        if entry is not None:
            await entry[1].aclose()


class RedisBudget(_RedisConnection):
    """Every process on every machine: GCRA in one Lua script on Redis' clock."""

    far = True

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
        _, _, script = self._client()
        budget, run = self._keys[0], report.run
        keys = [
            *self._keys,
            f"{budget}:share:{share.holder if share is not None else ''}",
            f"{budget}:runs",
            f"{budget}:runs:seen",
            f"{budget}:stop:{run.run_id if run is not None else ''}",
        ]
        args = _step_args(what, interval, report, share, count, lead, live)
        raw = await self._redis(lambda: script(keys=keys, args=args))
        step = _Answer._make(_text(v) for v in raw)
        self.epoch = step.epoch
        return Slot(
            wait=float(step.deferred) if step.deferred else float(step.wait),
            deferred=bool(step.deferred),
            at=float(step.at) if step.at else None,
            paused_for=min(MAX_PAUSE, max(0.0, float(step.paused_for))),
            pause_mark=float(step.mark),
            pause_reason=step.reason or None,
            pace=float(step.pace) if step.pace else None,
            pace_version=int(step.version),
            starts=int(step.starts),
            refused=int(step.refused),
            answered=int(step.answered),
            committed=step.committed == "1",
            epoch=step.epoch,
            stop=step.stop or None,
            live=step.live == "1",
            live_open=step.live_open == "1",
        )

    async def rewrite(self, entries: Sequence[Remembered]) -> None:
        by_record: dict[tuple[str, str], list[Remembered]] = {}
        for entry in entries:
            by_record.setdefault((entry.key_hash, entry.service), []).append(entry)
        for (key_hash, service), written in by_record.items():
            keys = [self._record_key(key_hash, service), _NAMES]
            args = [str(int(RECORD_SECONDS)), self.id, f"{key_hash} {service}"]
            for entry in written:
                args += [entry.name, f"{entry.at:.6f} {entry.value}"]
            await self._redis(self._eval(REWRITE, keys, args))

    async def ledger(self, seconds: float = LEDGER_SECONDS) -> Ledger:
        _, client, _ = self._client()
        raw = [_text(v) for v in await self._redis(lambda: client.eval(LEDGER, 1, self._keys[1], str(seconds)))]
        tallies = [Tally(*(int(n) for n in raw[i : i + 4])) for i in range(1, len(raw) - 3, 4)]
        return Ledger.of(float(raw[0]), tallies, seconds)

    async def lead(self, holder: str, state: str | None = None, *, release: bool = False) -> Lead:
        _, client, _ = self._client()
        args = [holder, state or "", "1" if release else "0", str(LEASE_SECONDS)]
        raw = await self._redis(lambda: client.eval(LEAD, 1, f"{self._keys[0]}:lead", *args))
        held, published, at, now = (_text(v) for v in raw)
        fresh = published if published and float(now) - float(at) <= SHARED_SECONDS else None
        return Lead(held or None, fresh, float(at), float(now))

    async def quota_claim(
        self, periods: Sequence[tuple[str, float]], limit: int | None, epoch: str | None = None
    ) -> QuotaCounts:
        keys = [self._keys[0], *(self._quota(name) for name, _ in periods)]
        args = [
            "" if limit is None else str(limit),
            epoch or "",
            os.urandom(8).hex(),
            *(str(int(keep)) for _, keep in periods),
        ]
        raw = await self._redis(self._eval(QUOTA, keys, args))
        counted, self.epoch = int(raw[0]), _text(raw[1])
        if counted == -2:
            raise BudgetReset(self.epoch)
        return QuotaCounts(self.epoch, tuple(int(n) for n in raw[2:]), counted == 1)

    async def quota_restore(self, into: str, old: str, counts: Sequence[tuple[str, int, float]]) -> None:
        keys = [self._keys[0], f"{self._keys[0]}:quota_restored", *(self._quota(name) for name, _, _ in counts)]
        args = [into, old, os.urandom(8).hex()]
        for name, count, keep in counts:
            args += [name, str(int(count)), str(max(1, math.ceil(keep)))]
        done, self.epoch = (_text(v) for v in await self._redis(self._eval(RESTORE, keys, args)))
        if done == "-2":
            raise BudgetReset(self.epoch)

    async def runs(self) -> list[RunEntry]:
        budget = self._keys[0]
        keys = [f"{budget}:runs", f"{budget}:runs:seen"]
        raw = [_text(v) for v in await self._redis(lambda: self._client()[1].eval(RUNS, 2, *keys, RUN_LEASE_SECONDS))]
        now, found = float(raw[0]), []
        for member, value in zip(raw[1::2], raw[2::2]):
            seen, run_id, entry = (value.split(" ", 2) + ["", ""])[:3]
            try:
                read = RunEntry.read(run_id, member, entry, float(seen), now)
            except ValueError:
                continue
            if read is not None:
                found.append(read)
        return sorted(found, key=lambda e: (e.run_id, e.member))

    async def leave(self, member: Member) -> None:
        _, client, _ = self._client()
        budget = self._keys[0]

        async def remove() -> None:
            async with client.pipeline(transaction=True) as pipe:
                pipe.hdel(f"{budget}:runs", member.member)
                pipe.zrem(f"{budget}:runs:seen", member.member)
                await pipe.execute()

        with hurried():  # a run's entry lapses on its own: not worth waiting for an outage
            await self._redis(remove)

    async def post_stop(self, run_id: str, cause: str) -> None:
        key = f"{self._keys[0]}:stop:{run_id}"
        await self._redis(lambda: self._client()[1].set(key, cause[:REASON_CHARS], ex=STOP_SECONDS))

    async def quota_give_back(self, periods: Sequence[str]) -> None:
        keys = [self._quota(name) for name in periods]
        await self._redis(lambda: self._client()[1].eval(GIVE_BACK, len(keys), *keys))

    async def quota_used(self, period: str) -> int:
        return int(await self._redis(lambda: self._client()[1].get(self._quota(period))) or 0)

    def _quota(self, period: str) -> str:
        return f"{self._keys[0]}:quota:{period}"


class _Answer(NamedTuple):
    """What the ``STEP`` script answers, in its order (each a text)."""

    wait: str
    at: str
    paused_for: str
    mark: str
    reason: str
    pace: str
    version: str
    starts: str
    refused: str
    deferred: str
    committed: str
    answered: str
    epoch: str
    stop: str
    live: str
    live_open: str


def _step_args(
    what: int, interval: float, report: Report, share: Share | None, count: int, lead: float, live: float = 0.0
) -> list[str]:
    """The ``STEP`` script's arguments (``redis_scripts.STEP`` numbers them)."""
    run = report.run
    return [
        f"{max(0.0, interval):.6f}",
        str(what),
        f"{max(0.0, report.pause_for):.6f}",
        (report.pause_reason or "")[:REASON_CHARS],
        "" if report.pace is None else f"{report.pace:.6f}",
        " ".join(f"{age:.4f}" for age in report.refused),
        str(MAX_AHEAD),
        str(MAX_PAUSE),
        str(KEEP_SECONDS),
        str(MINUTE),
        " ".join(f"{age:.4f}" for age in report.answered),
        "" if report.pace_base is None else str(report.pace_base),
        "" if share is None or what not in (RESERVE, RESERVE_ONLY, AHEAD) else f"{share.own_interval(interval):.6f}",
        str(ON_TIME),
        str(SHARED_SECONDS),
        str(TICK),
        os.urandom(8).hex(),
        "" if run is None else run.member,
        "" if run is None else run.run_id,
        "" if run is None or report.entry is None or len(report.entry) > ENTRY_CHARS else report.entry,
        str(RUN_LEASE_SECONDS),
        str(1 if share is not None else max(1, count)),
        " ".join(f"{age:.4f}" for age in report.started),
        f"{max(0.0, min(lead, interval + 1.0)):.6f}",
        f"{live:.6f}" if live > 0 else "",
        str(LIVE_LEASE),
        str(LIVE_SLACK),
        report.asker,
        str(QUEUE_MOST),
    ]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _said(exc: BaseException, secrets: tuple[str, ...]) -> str:
    """What a library said, in one line, without credentials (it may quote the URL it was given)."""
    return redact(redact_location(one_line(exc)), secrets)
