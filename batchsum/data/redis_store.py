"""``RedisStore``: the cluster's answer store (``budget="redis://..."``, or ``store=`` naming a Redis),
one key per answer under ``batchsum:store:{SERVICE}:`` (``...:key:HASH:`` for answers kept to a key),
kept for the store's retention (a job's own refusals, when it has no journal, under
``...:refusal:JOB:``, for a day); claims with the leases of ``leases``; every answer kept and claim let
go announced on ``...:answered``; and its upkeep (``RedisUpkeep``: entries listed, removed, the
retention set). A URL's ``?prefix=NAME`` puts every key of the store under ``NAME:`` (teams sharing
one database keep apart); it is taken off before the URL reaches the client."""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Collection, Iterable, Iterator
from typing import Any

from ..service.location import STORE, Location
from .leases import CLAIM_SECONDS, claim_owner, holder_is_gone
from .results import OK, Answer
from .stores import LOOKUP_CHUNK, REFUSAL_SECONDS, StoreError

__all__ = ["RedisStore", "RedisWatch", "RedisUpkeep", "PREFIX", "DEFAULT_RETENTION_DAYS", "take_in_old"]

PREFIX = "batchsum:store:"
DEFAULT_RETENTION_DAYS = 90
_OLD = "batchsum:answers:{{{identity}}}:"  # a key's answers before the one store (30 days' TTL)
_ANSWER = re.compile(r"\{(?P<service>[^}]*)\}:(?:key:[0-9a-f]+:)?(?P<fingerprint>[0-9a-f]{64})$")

_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
_TAKE_OVER = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end "
    "return false"
)
# Claims renewed; one that is gone (a Redis restarted without its data) made again for its holder.
_RENEW = """
for _, key in ipairs(KEYS) do
  local holder = redis.call('GET', key)
  if holder == ARGV[1] then redis.call('PEXPIRE', key, ARGV[2])
  elseif not holder then redis.call('SET', key, ARGV[1], 'PX', ARGV[2]) end
end
return 0
"""
# At a request's turn, per text (KEYS: its answer, its claim[, its job's refusal]): the answer when
# kept (ARGV[3] '1'; written since ARGV[4]), else the claim taken, else who holds it.
_TAKE = """
local out, stride, since = {}, tonumber(ARGV[5]), tonumber(ARGV[4])
for i = 1, #KEYS, stride do
  local kind, value = nil, ''
  if ARGV[3] == '1' then
    local raw = redis.call('GET', KEYS[i])
    if raw then
      local ok, fields = pcall(cjson.decode, raw)
      if ok and tonumber(fields[3]) >= since then kind, value = 'a', raw end
    end
    if not kind and stride == 3 then
      raw = redis.call('GET', KEYS[i + 2])
      if raw then
        local ok, fields = pcall(cjson.decode, raw)
        if ok and tonumber(fields[7]) >= since then kind, value = 'r', raw end
      end
    end
  end
  if not kind then
    if redis.call('SET', KEYS[i + 1], ARGV[1], 'NX', 'PX', ARGV[2]) then
      kind = 'c'
    else
      kind, value = 'h', redis.call('GET', KEYS[i + 1]) or ''
    end
  end
  out[#out + 1] = kind
  out[#out + 1] = value
end
return out
"""
# Answers kept (KEYS: answer, claim pairs; ARGV: holder, channel, message, then value and TTL per
# answer), their claims let go when this holder's, and the texts announced.
_PUT = """
for i = 1, #KEYS, 2 do
  local n = (i + 1) / 2
  redis.call('SET', KEYS[i], ARGV[2 + 2 * n], 'EX', ARGV[3 + 2 * n])
  if redis.call('GET', KEYS[i + 1]) == ARGV[1] then redis.call('DEL', KEYS[i + 1]) end
end
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return 0
"""
_RELEASE_MANY = """
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then redis.call('DEL', key) end
end
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return 0
"""


def _connect(url: str) -> Any:
    try:
        import redis
    except ImportError:
        raise StoreError("a redis:// answer store needs the redis package: pip install 'batchsum[redis]'") from None
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
    except ValueError as exc:  # a URL the client cannot read (its own words name no credential)
        from ..service.errors import redact_location

        raise StoreError(f"the answer store at Redis ({redact_location(url)}) cannot be opened: {exc}") from None


@contextlib.contextmanager
def _said(where: str) -> Iterator[None]:
    """Redis' errors (gone, refused, a command the user may not run, an entry it cannot read) as
    ``StoreError``: one line naming the store, without its credentials."""
    try:
        yield
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - redis' errors, without importing them here
        raise StoreError(f"the answer store at {where}: {exc}") from None


def _retention(client: Any, config: str) -> int:
    days = client.hget(config, "retention_days")
    return int(days) if days is not None else DEFAULT_RETENTION_DAYS


class RedisStore:
    """The answers of ``service`` (in ``scope``) in the Redis at ``url``, one key each
    (``batchsum:store:{SERVICE}:FP``, the service as the hash tag: a cluster keeps a service's answers on
    one node), kept the store's retention after they were written; claims as ``MachineStore``'s, their
    lease on Redis' own clock; ``job``: the job whose refusals it keeps too, for a day, seen by that job
    alone (None: summaries only). ``StoreError`` when Redis cannot be reached."""

    claims = True
    writable = True

    def __init__(self, url: Location | str, service: str, *, job: str | None = None, scope: str = "") -> None:
        from ..service.errors import redact_location

        place = Location.of(url, STORE)
        url, self.prefix = place.url, place.prefix
        self.where = f"Redis ({redact_location(url)}{f', prefix {self.prefix[:-1]}' if self.prefix else ''})"
        self.job = job
        self.scope = scope
        self._redis = _connect(url)
        self._base = f"{self.prefix}{PREFIX}{{{service}}}:{f'key:{scope}:' if scope else ''}"
        self._channel = self._base + "answered"
        self._owner = claim_owner()
        self._held: set[str] = set()  # the claims this holder took and has not let go
        self._url = url
        try:
            self._ttl = _retention(self._redis, self.prefix + PREFIX + "config") * 86400
        except Exception as exc:  # noqa: BLE001 - redis' errors, without importing them here
            self._redis.close()
            raise StoreError(f"the answer store at {self.where} cannot be reached: {exc}") from None
        self._release = self._redis.register_script(_RELEASE)
        self._take_over = self._redis.register_script(_TAKE_OVER)
        self._renew = self._redis.register_script(_RENEW)
        self._take = self._redis.register_script(_TAKE)
        self._put = self._redis.register_script(_PUT)
        self._release_many = self._redis.register_script(_RELEASE_MANY)

    def get(self, key: str) -> Answer | None:
        return self.get_many([key]).get(key)

    def _answer(self, key: str) -> str:
        return self._base + key

    def _claim(self, key: str) -> str:
        return f"{self._base}claim:{key}"

    def _refusal(self, key: str) -> str:
        return f"{self._base}refusal:{self.job}:{key}"

    def get_many(self, keys: list[str], since: float | None = None) -> dict[str, Answer]:
        """The answers kept for ``keys``, and the job's refusals for the others: one ``MGET`` per
        ``LOOKUP_CHUNK`` keys. ``since``: only those written since then (``time.time()``)."""
        return self.look_many(keys, since, claims=False)[0]

    def look_many(
        self, keys: Collection[str], since: float | None = None, *, claims: bool = True
    ) -> tuple[dict[str, Answer], set[str]]:
        """The answers kept for ``keys`` (and the job's refusals), and which of the others another run
        holds now (``claims``): one ``MGET`` per ``LOOKUP_CHUNK`` keys, nothing written."""
        found: dict[str, Answer] = {}
        held: set[str] = set()
        oldest = -math.inf if since is None else since
        keys = list(keys)
        with _said(self.where):
            for start in range(0, len(keys), LOOKUP_CHUNK):
                chunk = keys[start : start + LOOKUP_CHUNK]
                names = [self._answer(key) for key in chunk]
                if claims:
                    names += [self._claim(key) for key in chunk]
                if self.job is not None:
                    names += [self._refusal(key) for key in chunk]
                values = self._redis.mget(names)
                n = len(chunk)
                for i, key in enumerate(chunk):
                    answer = _read(values[i], None if self.job is None else values[-n + i], oldest)
                    if answer is not None:
                        found[key] = answer
                    elif claims and (holder := values[n + i]) is not None and not self._mine(key, holder):
                        if not holder_is_gone(holder):
                            held.add(key)
        return found, held

    def _mine(self, key: str, holder: bytes) -> bool:
        return key in self._held and holder == self._owner.encode()

    def put(self, key: str, answer: Answer) -> None:
        """Keep ``answer``: a summary for every job of its scope (it replaces what was kept:
        ``refresh``); a refusal for this store's ``job`` alone, for a day (no job: not kept)."""
        self.put_many([(key, answer)])

    def put_many(self, answers: Iterable[tuple[str, Answer]]) -> None:
        """``put`` for each of ``answers`` in one script: kept, this holder's claims on them let go,
        and the texts announced on the store's channel (a run waiting for one looks at once)."""
        keys: list[str] = []
        values: list[Any] = []
        told: list[str] = []
        now = time.time()
        for key, answer in answers:
            if answer.status == OK and answer.summary is not None:
                name, ttl = self._answer(key), self._ttl
                value = json.dumps([answer.summary, answer.attempts, now])
            elif self.job is not None:
                name, ttl = self._refusal(key), min(REFUSAL_SECONDS, self._ttl)
                value = json.dumps([*answer, now])
            else:
                continue
            keys += [name, self._claim(key)]
            values += [value, ttl]
            told.append(key)
        if not keys:
            return
        with _said(self.where):
            for start in range(0, len(keys), 2 * LOOKUP_CHUNK):
                part = told[start // 2 : start // 2 + LOOKUP_CHUNK]
                args = [self._owner, self._channel, " ".join(part), *values[start : start + 2 * LOOKUP_CHUNK]]
                self._put(keys=keys[start : start + 2 * LOOKUP_CHUNK], args=args)
        self._held.difference_update(told)

    def claim(self, key: str) -> bool:
        return self.take_many([key], look=False)[key] is True

    def take_many(self, keys: Collection[str], since: float | None = None, look: bool = True) -> dict[str, Any]:
        """At a request's turn, for each of ``keys``, in one script call (per ``LOOKUP_CHUNK``): its
        answer when the store keeps one (``look``; written since ``since``), else True when this run
        now holds its claim, False when another run holds it."""
        keys = list(keys)
        lease = int(CLAIM_SECONDS * 1000)
        stride = 3 if self.job is not None and look else 2
        out: dict[str, Any] = {}
        with _said(self.where):
            for start in range(0, len(keys), LOOKUP_CHUNK):
                chunk = keys[start : start + LOOKUP_CHUNK]
                names: list[str] = []
                for key in chunk:
                    names += [self._answer(key), self._claim(key)] + ([self._refusal(key)] if stride == 3 else [])
                since_arg = 0 if since is None else since
                got = self._take(keys=names, args=[self._owner, lease, int(look), since_arg, stride])
                for key, kind, value in zip(chunk, got[::2], got[1::2]):
                    out[key] = self._taken(key, kind, value, lease)
        return out

    def _taken(self, key: str, kind: bytes, value: bytes, lease: int) -> Any:
        """What ``_TAKE`` said of ``key``: an answer, True (claimed), or False (held by another)."""
        if kind == b"a":
            summary, attempts, _ = json.loads(value)
            return Answer(summary, OK, None, None, 200, attempts)
        if kind == b"r":
            return Answer(*json.loads(value)[:6])
        if kind == b"c":
            self._held.add(key)
            return True
        mine = value == self._owner.encode() and key not in self._held  # a release that failed: its own
        if mine or (value and holder_is_gone(value)):  # gone only when surely a dead process of this machine
            if self._take_over(keys=[self._claim(key)], args=[value, self._owner, lease]):
                self._held.add(key)
                return True
        return False

    def release(self, key: str) -> None:
        self.release_many([key])

    def release_many(self, keys: Collection[str]) -> None:
        """This run's claims on ``keys`` let go in one script, and the texts announced (a run waiting
        for one takes it)."""
        mine = [key for key in keys if key in self._held]
        if not mine:
            return
        with _said(self.where):
            self._release_many(
                keys=[self._claim(key) for key in mine], args=[self._owner, self._channel, " ".join(mine)]
            )
        self._held.difference_update(mine)

    def renew(self, keys: Collection[str]) -> None:
        """Extend this run's claims on ``keys`` (one script call per ``LOOKUP_CHUNK`` keys); one lost
        with a Redis that came back empty is made again."""
        names = [self._claim(key) for key in keys if key in self._held]
        with _said(self.where):
            for start in range(0, len(names), LOOKUP_CHUNK):
                self._renew(keys=names[start : start + LOOKUP_CHUNK], args=[self._owner, int(CLAIM_SECONDS * 1000)])

    def watcher(self) -> RedisWatch:
        """The store's channel, to wait on from the event loop (``RedisWatch``: a client of its own)."""
        return RedisWatch(self._url, self._channel)

    def ping(self) -> None:
        with _said(self.where):
            self._redis.ping()

    def close(self) -> None:
        self._redis.close()


class RedisWatch:
    """The answers kept and claims let go that a store's channel announces, awaited on the event loop
    (an async client of its own: no thread waits on the socket)."""

    def __init__(self, url: str, channel: str) -> None:
        import redis.asyncio

        self._client = redis.asyncio.Redis.from_url(url, socket_connect_timeout=5)
        self._channel = channel
        self._pubsub: Any = None

    async def wait(self, timeout: float, wanted: Collection[str]) -> bool:
        """Up to ``timeout`` seconds for an announcement of one of ``wanted``; whether one came."""
        import asyncio

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._pubsub is None:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            await pubsub.subscribe(self._channel)
            self._pubsub = pubsub
        while (left := deadline - loop.time()) > 0:
            message = await self._pubsub.get_message(timeout=left)
            if message is not None and not set(bytes(message["data"]).decode().split()).isdisjoint(wanted):
                return True
        return False

    async def aclose(self) -> None:
        if self._pubsub is not None:
            await self._pubsub.aclose()
        await self._client.aclose()


def take_in_old(store: RedisStore, identity: str) -> int:
    """The summaries a key (``identity``) kept under the per-key store of earlier versions, taken into
    ``store`` once (a marker says it was done); how many."""
    marker = f"{store.prefix}{PREFIX}imported:{identity}"
    with _said(store.where):
        if store._redis.exists(marker):
            return 0
        old = _OLD.format(identity=identity)
        names = [n for n in store._redis.scan_iter(match=old + "*", count=1000) if b":claim:" not in n]
        taken = 0
        for start in range(0, len(names), LOOKUP_CHUNK):
            chunk = names[start : start + LOOKUP_CHUNK]
            pipe = store._redis.pipeline(transaction=False)
            for name, raw in zip(chunk, store._redis.mget(chunk)):
                fields = json.loads(raw) if raw is not None else None
                if fields and fields[1] == OK and fields[0] is not None:
                    value = json.dumps([fields[0], fields[5], time.time()])
                    pipe.set(store._base + name.decode()[len(old) :], value, ex=store._ttl, nx=True)
                    taken += 1
            pipe.execute()
        store._redis.set(marker, taken)
    return taken


def _read(raw: bytes | None, refused: bytes | None, oldest: float) -> Answer | None:
    """An answer as kept (a summary's ``[summary, attempts, written]``, else a job's refusal), when
    written since ``oldest``."""
    if raw is not None:
        summary, attempts, written = json.loads(raw)
        if written >= oldest:
            return Answer(summary, OK, None, None, 200, attempts)
    if refused is not None and (fields := json.loads(refused))[6] >= oldest:
        return Answer(*fields[:6])
    return None


class RedisUpkeep:
    """What ``batchsum store`` does on the cluster's store: entries by service and age, removed by age
    or service, the retention set (new answers are kept that long; Redis' own memory policy is its
    size cap)."""

    def __init__(self, url: Location | str) -> None:
        from ..service.errors import redact_location

        place = Location.of(url, STORE)
        url, self._prefix = place.url, place.prefix
        self.where = f"Redis ({redact_location(url)})"
        self._redis = _connect(url)
        self._config = self._prefix + PREFIX + "config"

    def _entries(self) -> Iterator[tuple[bytes, str, float]]:
        """Every answer: its key, service and when it was written."""
        start_of = self._prefix + PREFIX
        names = [n for n in self._redis.scan_iter(match=start_of + "{*", count=1000) if b":claim:" not in n]
        for start in range(0, len(names), LOOKUP_CHUNK):
            chunk = names[start : start + LOOKUP_CHUNK]
            for name, raw in zip(chunk, self._redis.mget(chunk)):
                found = _ANSWER.match(name.decode()[len(start_of) :])
                if found is not None and raw is not None:
                    yield name, found["service"], float(json.loads(raw)[2])

    def inventory(self) -> list[tuple[str, float]]:
        """Every answer's service and when it was written."""
        with _said(self.where):
            return [(service, written) for _, service, written in self._entries()]

    def remove(self, *, before: float | None = None, service: str | None = None) -> int:
        """The answers written before ``before`` and of ``service`` (None: any) removed; how many."""
        with _said(self.where):
            gone = [
                name
                for name, of, written in self._entries()
                if (before is None or written < before) and (service is None or of == service)
            ]
            for start in range(0, len(gone), LOOKUP_CHUNK):
                self._redis.delete(*gone[start : start + LOOKUP_CHUNK])
        return len(gone)

    def settings(self) -> dict[str, Any]:
        with _said(self.where):
            return {"retention_days": _retention(self._redis, self._config), "max_bytes": None, "bytes": None}

    def configure(self, *, retention_days: int | None = None, max_bytes: int | None = None) -> None:
        if max_bytes is not None:
            raise StoreError(
                "a Redis store's size is Redis' own (maxmemory and its eviction policy): --max-size is for a machine's store"
            )
        if retention_days is not None:
            with _said(self.where):
                self._redis.hset(self._config, "retention_days", retention_days)

    def close(self) -> None:
        self._redis.close()
