"""``RedisStore``: the cluster's answer store (``budget="redis://..."``, or ``store=`` naming a Redis),
one key per answer under ``batchsum:store:{SERVICE}:``, kept for the store's retention (a job's own
refusals, when it has no journal, under ``...:refusal:JOB:``, for a day); claims with the leases of
``leases``; and its upkeep (``RedisUpkeep``: entries listed, removed, the retention set)."""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Collection, Iterator
from typing import Any

from .leases import CLAIM_SECONDS, claim_owner, holder_is_gone
from .results import OK, Answer
from .stores import LOOKUP_CHUNK, REFUSAL_SECONDS, StoreError

__all__ = ["RedisStore", "RedisUpkeep", "PREFIX", "DEFAULT_RETENTION_DAYS"]

PREFIX = "batchsum:store:"
CONFIG = PREFIX + "config"
DEFAULT_RETENTION_DAYS = 90
_OLD = "batchsum:answers:{{{identity}}}:"  # a key's answers before the one store (30 days' TTL)
_ANSWER = re.compile(r"\{(?P<service>.*)\}:(?P<fingerprint>[0-9a-f]{64})$")

_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
_TAKE_OVER = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end "
    "return false"
)
_RENEW = (
    "for _, key in ipairs(KEYS) do if redis.call('GET', key) == ARGV[1] then redis.call('PEXPIRE', key, ARGV[2]) end "
    "end return 0"
)


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


def _retention(client: Any) -> int:
    days = client.hget(CONFIG, "retention_days")
    return int(days) if days is not None else DEFAULT_RETENTION_DAYS


class RedisStore:
    """The answers of ``service`` in the Redis at ``url``, one key each (``batchsum:store:{SERVICE}:FP``,
    the service as the hash tag: a cluster keeps a service's answers on one node), kept the store's
    retention after they were written; claims as ``MachineStore``'s, their lease on Redis' own clock;
    ``job``: the job whose refusals it keeps too, for a day, seen by that job alone (None: summaries
    only). ``StoreError`` when Redis cannot be reached."""

    claims = True

    def __init__(self, url: str, service: str, *, job: str | None = None) -> None:
        from ..service.errors import redact_location

        self.where = f"Redis ({redact_location(url)})"
        self.job = job
        self._redis = _connect(url)
        self._prefix = f"{PREFIX}{{{service}}}:"
        self._owner = claim_owner()
        try:
            self._ttl = _retention(self._redis) * 86400
        except Exception as exc:  # noqa: BLE001 - redis' errors, without importing them here
            self._redis.close()
            raise StoreError(f"the answer store at {self.where} cannot be reached: {exc}") from None
        self._release = self._redis.register_script(_RELEASE)
        self._take_over = self._redis.register_script(_TAKE_OVER)
        self._renew = self._redis.register_script(_RENEW)

    def get(self, key: str) -> Answer | None:
        return self.get_many([key]).get(key)

    def _refusal(self, key: str) -> str:
        return f"{self._prefix}refusal:{self.job}:{key}"

    def get_many(self, keys: list[str], since: float | None = None) -> dict[str, Answer]:
        """The answers kept for ``keys``, and the job's refusals for the others: one ``MGET`` each
        per ``LOOKUP_CHUNK`` keys. ``since``: only those written since then (``time.time()``)."""
        found: dict[str, Answer] = {}
        oldest = -math.inf if since is None else since
        with _said(self.where):
            for start in range(0, len(keys), LOOKUP_CHUNK):
                chunk = keys[start : start + LOOKUP_CHUNK]
                for key, raw in zip(chunk, self._redis.mget([self._prefix + key for key in chunk])):
                    if raw is not None:
                        summary, attempts, written = json.loads(raw)
                        if written >= oldest:
                            found[key] = Answer(summary, OK, None, None, 200, attempts)
                rest = [key for key in chunk if key not in found]
                if self.job is not None and rest:
                    for key, raw in zip(rest, self._redis.mget([self._refusal(key) for key in rest])):
                        if raw is not None and (fields := json.loads(raw))[6] >= oldest:
                            found[key] = Answer(*fields[:6])
        return found

    def put(self, key: str, answer: Answer) -> None:
        """Keep ``answer``: a summary for every job (it replaces what was kept: ``refresh``); a
        refusal for this store's ``job`` alone, for a day (no job: not kept)."""
        with _said(self.where):
            if answer.status == OK and answer.summary is not None:
                value = json.dumps([answer.summary, answer.attempts, time.time()])
                self._redis.set(self._prefix + key, value, ex=self._ttl)
            elif self.job is not None:
                value = json.dumps([*answer, time.time()])
                self._redis.set(self._refusal(key), value, ex=min(REFUSAL_SECONDS, self._ttl))

    def claim(self, key: str) -> bool:
        name = f"{self._prefix}claim:{key}"
        lease = int(CLAIM_SECONDS * 1000)
        with _said(self.where):
            if self._redis.set(name, self._owner, nx=True, px=lease):
                return True
            holder = self._redis.get(name)
            if holder is None or not holder_is_gone(holder):  # gone only when surely a dead process of this machine
                return False
            return bool(self._take_over(keys=[name], args=[holder, self._owner, lease]))

    def release(self, key: str) -> None:
        with _said(self.where):
            self._release(keys=[f"{self._prefix}claim:{key}"], args=[self._owner])

    def renew(self, keys: Collection[str]) -> None:
        """Extend this run's claims on ``keys`` (one script call per ``LOOKUP_CHUNK`` keys)."""
        names = [f"{self._prefix}claim:{key}" for key in keys]
        with _said(self.where):
            for start in range(0, len(names), LOOKUP_CHUNK):
                self._renew(keys=names[start : start + LOOKUP_CHUNK], args=[self._owner, int(CLAIM_SECONDS * 1000)])

    def take_in_old(self, identity: str) -> int:
        """The summaries a key (``identity``) kept under the per-key store of earlier versions, taken
        in as this service's once (a marker says it was done); how many."""
        marker = f"{PREFIX}imported:{identity}"
        with _said(self.where):
            if self._redis.exists(marker):
                return 0
            old = _OLD.format(identity=identity)
            names = [n for n in self._redis.scan_iter(match=old + "*", count=1000) if b":claim:" not in n]
            taken = 0
            for start in range(0, len(names), LOOKUP_CHUNK):
                chunk = names[start : start + LOOKUP_CHUNK]
                pipe = self._redis.pipeline(transaction=False)
                for name, raw in zip(chunk, self._redis.mget(chunk)):
                    fields = json.loads(raw) if raw is not None else None
                    if fields and fields[1] == OK and fields[0] is not None:
                        value = json.dumps([fields[0], fields[5], time.time()])
                        pipe.set(self._prefix + name.decode()[len(old) :], value, ex=self._ttl, nx=True)
                        taken += 1
                pipe.execute()
            self._redis.set(marker, taken)
        return taken

    def close(self) -> None:
        self._redis.close()


class RedisUpkeep:
    """What ``batchsum store`` does on the cluster's store: entries by service and age, removed by age
    or service, the retention set (new answers are kept that long; Redis' own memory policy is its
    size cap)."""

    def __init__(self, url: str) -> None:
        from ..service.errors import redact_location

        self.where = f"Redis ({redact_location(url)})"
        self._redis = _connect(url)

    def _entries(self) -> Iterator[tuple[bytes, str, float]]:
        """Every answer: its key, service and when it was written."""
        names = [n for n in self._redis.scan_iter(match=PREFIX + "{*", count=1000) if b":claim:" not in n]
        for start in range(0, len(names), LOOKUP_CHUNK):
            chunk = names[start : start + LOOKUP_CHUNK]
            for name, raw in zip(chunk, self._redis.mget(chunk)):
                found = _ANSWER.match(name.decode()[len(PREFIX) :])
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
            return {"retention_days": _retention(self._redis), "max_bytes": None, "bytes": None}

    def configure(self, *, retention_days: int | None = None, max_bytes: int | None = None) -> None:
        if max_bytes is not None:
            raise StoreError(
                "a Redis store's size is Redis' own (maxmemory and its eviction policy): --max-size is for a machine's store"
            )
        if retention_days is not None:
            with _said(self.where):
                self._redis.hset(CONFIG, "retention_days", retention_days)

    def close(self) -> None:
        self._redis.close()
