"""``RedisBudget``: a key's budget shared by every process on every machine, GCRA in one Lua script on
Redis' own clock, with the entries remembered of each key.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ..service.errors import BudgetError, location_secrets, one_line, redact, redact_location
from .exchange import (
    LEASE_SECONDS,
    RECORD_SECONDS,
    RESERVE,
    RESERVE_ONLY,
    SETTING,
    SHARED_SECONDS,
    Budget,
    Lead,
    Remembered,
    Report,
    Share,
    Slot,
)
from .gcra import KEEP_SECONDS, MAX_AHEAD, MAX_PAUSE, MINUTE, ON_TIME, REASON_CHARS
from .ledger import LEDGER_SECONDS, TICK, Ledger, Tally

__all__ = ["RedisBudget"]

T = TypeVar("T")


# GCRA on Redis' own clock: the same steps as gcra.State.advance, in one atomic script. Numbers go back
# as strings (Redis turns Lua numbers into integers). ARGV[2]: LOOK, RESERVE, COMMIT or RESERVE_ONLY.
# The key's counts: a hash per second (KEYS[2]:SECOND) of the second's totals (s, a, r) and its ticks'
# (s3, a3, r3: the fourth tenth); ARGV[6] and ARGV[11]: the ages of the starts answered 429 and clean.
# The trailing minute is summed from the tick ARGV[10] seconds back, as the SQLite budget sums it: the
# ticks of its first second, then whole seconds.
_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local interval, what = math.max(0, tonumber(ARGV[1])), tonumber(ARGV[2])
local pause_for, reason, pace = tonumber(ARGV[3]), ARGV[4], ARGV[5]
local max_ahead, max_pause, keep, minute = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local base = ARGV[12]
local share_interval = tonumber(ARGV[13])
local on_time, shared_seconds, tick = tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])
local deferred = ''
if (what == 1 or what == 3) and share_interval ~= nil then
  local own = tonumber(redis.call('GET', KEYS[3])) or 0
  if own > now + share_interval + max_ahead then own = 0 end
  if own > now + on_time then
    deferred = string.format('%.6f', own - now)
    what = 0
  end
end
local s = redis.call('HMGET', KEYS[1], 'tat', 'paused_until', 'reason', 'pace', 'pace_version', 'last', 'pace_at',
  'updated')
local tat, paused_until = tonumber(s[1]) or 0, tonumber(s[2]) or 0
local old_reason, old_pace, version = s[3] or '', s[4] or '', tonumber(s[5]) or 0
local last, pace_at, updated = tonumber(s[6]) or 0, tonumber(s[7]) or 0, tonumber(s[8]) or 0
if now < updated then
  local back = now - updated
  tat, last, paused_until, pace_at = tat + back, last + back, paused_until + back, pace_at + back
end
if tat > now + interval + max_ahead then tat = now end
if last > now + max_ahead then last = now - interval end
if paused_until > now + max_pause then paused_until = now end
if pause_for > 0 and now + pause_for > paused_until then
  paused_until = now + math.min(pause_for, max_pause)
  old_reason = reason
end
if pace ~= '' and (base == '' or tonumber(base) == version) then
  old_pace = pace; version = version + 1; pace_at = now
end
local at = nil
local committed = '0'
if what ~= 0 then
  local due = math.max(last + interval, paused_until)
  if what == 2 then
    if due > now + on_time then at = due else at = now; last = now; committed = '1' end
  else
    at = math.max(tat, due, now)
    tat = at + interval
    if at <= now + on_time and what == 1 then at = now; last = now; committed = '1' end
    if share_interval ~= nil then
      redis.call('SET', KEYS[3], string.format('%.6f', at + share_interval), 'EX', keep)
    end
  end
end
redis.call('HSET', KEYS[1], 'tat', string.format('%.6f', tat), 'paused_until', string.format('%.6f', paused_until),
  'reason', old_reason, 'pace', old_pace, 'pace_version', version, 'last', string.format('%.6f', last),
  'pace_at', string.format('%.6f', pace_at), 'updated', string.format('%.6f', now))
redis.call('EXPIRE', KEYS[1], 86400)
local function count(when, field)
  local ticks = math.floor(when / tick + 1e-9)
  local d = ticks % 10
  local k = KEYS[2] .. ':' .. ((ticks - d) / 10)
  redis.call('HINCRBY', k, field, 1)
  redis.call('HINCRBY', k, field .. d, 1)
  redis.call('EXPIRE', k, keep)
end
if committed == '1' then count(now, 's') end
for age in string.gmatch(ARGV[11], '%S+') do count(now - tonumber(age), 'a') end
for age in string.gmatch(ARGV[6], '%S+') do count(now - tonumber(age), 'r') end
local starts, refusals, answers = 0, 0, 0
local from = math.floor((now - minute) / tick + 1e-9)
local d0 = from % 10
local first = (from - d0) / 10
local fields = {}
for d = d0, 9 do
  table.insert(fields, 's' .. d); table.insert(fields, 'r' .. d); table.insert(fields, 'a' .. d)
end
local c = redis.call('HMGET', KEYS[2] .. ':' .. first, unpack(fields))
for i = 1, #c, 3 do
  starts = starts + (tonumber(c[i]) or 0)
  refusals = refusals + (tonumber(c[i + 1]) or 0)
  answers = answers + (tonumber(c[i + 2]) or 0)
end
for second = first + 1, math.floor(math.floor(now / tick + 1e-9) / 10) do
  c = redis.call('HMGET', KEYS[2] .. ':' .. second, 's', 'r', 'a')
  starts = starts + (tonumber(c[1]) or 0)
  refusals = refusals + (tonumber(c[2]) or 0)
  answers = answers + (tonumber(c[3]) or 0)
end
local wait = 0
if at ~= nil and committed == '0' then wait = math.max(0, at - now) end
local at_text = ''
if at ~= nil then at_text = string.format('%.6f', at) end
if now - pace_at > shared_seconds then old_pace = '' end
return {string.format('%.6f', wait), at_text, string.format('%.6f', paused_until - now), string.format('%.6f', paused_until),
  old_reason, old_pace, tostring(version), tostring(starts), tostring(refusals), deferred, committed, tostring(answers)}
"""

# The key's counts of the last ARGV[1] seconds: each second's ticks as (tick, starts, answered, refused).
_LEDGER_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local out = {string.format('%.6f', now)}
for second = math.floor(now - tonumber(ARGV[1])), math.floor(now) do
  local c = redis.call('HGETALL', KEYS[1] .. ':' .. second)
  if #c > 0 then
    local f = {}
    for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
    for d = 0, 9 do
      local s, a, r = f['s' .. d], f['a' .. d], f['r' .. d]
      if s or a or r then
        table.insert(out, tostring(second * 10 + d))
        table.insert(out, s or '0')
        table.insert(out, a or '0')
        table.insert(out, r or '0')
      end
    end
  end
end
return out
"""

# The lead of the key's search: granted to ARGV[1] when free, lapsed or its own; ARGV[2] its state
# to publish ('' none); ARGV[3] '1' to let it go. Returns holder, state, state_at, now.
_LEAD_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local holder, state, release, lease = ARGV[1], ARGV[2], ARGV[3] == '1', tonumber(ARGV[4])
local l = redis.call('HMGET', KEYS[1], 'holder', 'until', 'state', 'state_at')
local held, lapses, published, at = l[1] or '', tonumber(l[2]) or 0, l[3] or '', tonumber(l[4]) or 0
if held == '' or held == holder or lapses < now or lapses > now + 2 * lease then
  if state ~= '' then published = state; at = now end
  if release then held = ''; lapses = 0 else held = holder; lapses = now + lease end
  redis.call('HSET', KEYS[1], 'holder', held, 'until', string.format('%.6f', lapses), 'state', published,
    'state_at', string.format('%.6f', at))
  redis.call('EXPIRE', KEYS[1], 86400)
end
return {held, published, string.format('%.6f', at), string.format('%.6f', now)}
"""

# The key's paid requests per period: one more in each period KEYS[i] (kept ARGV[i + 1] seconds) unless
# the first holds the limit ARGV[1] already ('' none): -1. Returns the first's count.
_QUOTA_LUA = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if ARGV[1] ~= '' and used >= tonumber(ARGV[1]) then return -1 end
for i = 1, #KEYS do
  local n = redis.call('INCR', KEYS[i])
  if i == 1 then used = n end
  redis.call('EXPIRE', KEYS[i], math.ceil(tonumber(ARGV[i + 1])))
end
return used
"""

_GIVE_BACK_LUA = """
for i = 1, #KEYS do
  if tonumber(redis.call('GET', KEYS[i]) or '0') > 0 then redis.call('DECR', KEYS[i]) end
end
"""

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

    def __init__(self, url: str, key_id: str) -> None:
        try:
            import redis.asyncio  # noqa: F401
        except ImportError:
            raise BudgetError("a redis:// budget needs the redis package: pip install 'batchsum[redis]'") from None
        self.url = url
        self.id = key_id
        self.where = redact_location(url)
        self._secrets = location_secrets(url)
        self._keys = [f"batchsum:budget:{{{key_id}}}", f"batchsum:budget:{{{key_id}}}:counts"]
        self._clients: dict[int, Any] = {}

    def _client(self) -> Any:
        import asyncio

        import redis.asyncio

        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            client = redis.asyncio.Redis.from_url(
                self.url, socket_connect_timeout=5, socket_timeout=10, health_check_interval=30
            )
            entry = (loop, client, client.register_script(_LUA))  # the budget's step, loaded once a connection
            self._clients[id(loop)] = entry
        return entry

    async def _redis(self, command: Callable[[], Awaitable[T]]) -> T:
        """``command`` on the budget's Redis, tried up to three times when the connection fails."""
        import asyncio

        import redis.exceptions

        for attempt in range(_REDIS_ATTEMPTS):
            try:
                return await command()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
                if attempt == _REDIS_ATTEMPTS - 1:
                    raise BudgetError(
                        f"cannot reach the rate budget at {self.where} ({_said(exc, self._secrets)}) after "
                        f"{_REDIS_ATTEMPTS} tries; start it, or set {SETTING} to machine or none"
                    ) from None
                await asyncio.sleep(0.2 * 2**attempt)
            except redis.exceptions.RedisError as exc:
                raise BudgetError(f"the rate budget at {self.where} refused: {_said(exc, self._secrets)}") from None
        raise AssertionError("unreachable")

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
                    pipe.delete(f"batchsum:budget:{{{key_id}}}:lead")
                gone = sum(int(n) for n in (await pipe.execute())[: len(matching)])
            for key_id in ids:
                async for counts in client.scan_iter(match=f"batchsum:budget:{{{key_id}}}:counts:*", count=500):
                    await client.delete(counts)
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

    async def _call(self, what: int, interval: float, report: Report, share: Share | None) -> Slot:
        _, _, script = self._client()
        keys = self._keys if share is None else [*self._keys, f"{self._keys[0]}:share:{share.holder}"]
        args = [
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
            "" if share is None or what not in (RESERVE, RESERVE_ONLY) else f"{share.own_interval(interval):.6f}",
            str(ON_TIME),
            str(SHARED_SECONDS),
            str(TICK),
        ]
        raw = await self._redis(lambda: script(keys=keys, args=args))
        wait, at, paused_for, mark, reason, pace, version, starts, refused, deferred, committed, answered = (
            _text(v) for v in raw
        )
        return Slot(
            wait=float(deferred) if deferred else float(wait),
            deferred=bool(deferred),
            at=float(at) if at else None,
            paused_for=min(MAX_PAUSE, max(0.0, float(paused_for))),
            pause_mark=float(mark),
            pause_reason=reason or None,
            pace=float(pace) if pace else None,
            pace_version=int(version),
            starts=int(starts),
            refused=int(refused),
            answered=int(answered),
            committed=committed == "1",
        )

    async def ledger(self, seconds: float = LEDGER_SECONDS) -> Ledger:
        _, client, _ = self._client()
        raw = [_text(v) for v in await self._redis(lambda: client.eval(_LEDGER_LUA, 1, self._keys[1], str(seconds)))]
        tallies = [Tally(*(int(n) for n in raw[i : i + 4])) for i in range(1, len(raw) - 3, 4)]
        return Ledger.of(float(raw[0]), tallies, seconds)

    async def lead(self, holder: str, state: str | None = None, *, release: bool = False) -> Lead:
        _, client, _ = self._client()
        args = [holder, state or "", "1" if release else "0", str(LEASE_SECONDS)]
        raw = await self._redis(lambda: client.eval(_LEAD_LUA, 1, f"{self._keys[0]}:lead", *args))
        held, published, at, now = (_text(v) for v in raw)
        fresh = published if published and float(now) - float(at) <= SHARED_SECONDS else None
        return Lead(held or None, fresh, float(at), float(now))

    async def quota_claim(self, periods: Sequence[tuple[str, float]], limit: int | None) -> int | None:
        keys = [self._quota(name) for name, _ in periods]
        args = ["" if limit is None else str(limit), *(str(int(keep)) for _, keep in periods)]
        used = await self._redis(lambda: self._client()[1].eval(_QUOTA_LUA, len(keys), *keys, *args))
        return None if int(used) < 0 else int(used)

    async def quota_give_back(self, periods: Sequence[str]) -> None:
        keys = [self._quota(name) for name in periods]
        await self._redis(lambda: self._client()[1].eval(_GIVE_BACK_LUA, len(keys), *keys))

    async def quota_used(self, period: str) -> int:
        return int(await self._redis(lambda: self._client()[1].get(self._quota(period))) or 0)

    def _quota(self, period: str) -> str:
        return f"{self._keys[0]}:quota:{period}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _said(exc: BaseException, secrets: tuple[str, ...]) -> str:
    """What a library said, in one line, without credentials (it may quote the URL it was given)."""
    return redact(redact_location(one_line(exc)), secrets)
