"""``RedisStore``: answers and claims in Redis, for runs on many machines (``budget="redis://..."``),
one key per answer and per claim, with the claims' leases of ``stores``."""

from __future__ import annotations

import json
from collections.abc import Collection

from ..service.errors import BudgetError
from .leases import CLAIM_SECONDS, claim_owner, holder_is_gone
from .results import Answer
from .stores import LOOKUP_CHUNK

__all__ = ["RedisStore"]

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
        if holder is None or not holder_is_gone(holder):  # gone only when surely a dead process of this machine
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
