"""The Redis budget's scripts (Lua), each one atomic step on Redis' own clock: the GCRA step with the
key's counts, the runs' registry and a job's stop (``STEP``), the ledger, the lead, the quotas' counts
and the runs on the key; each does what its twin in ``gcra.py`` / ``sqlite_budget.py`` does.
"""

import string

__all__ = ["ticks", "live_runs", "STEP", "RUNS", "LEDGER", "LEAD", "QUOTA", "RESTORE", "GIVE_BACK", "REWRITE"]

# GCRA on Redis' own clock: the same steps as gcra.State.advance, in one atomic script. Numbers go back
# as strings (Redis turns Lua numbers into integers). ARGV[2]: LOOK, RESERVE, COMMIT or RESERVE_ONLY.
# The key's counts: a hash per second (KEYS[2]:SECOND) of the second's totals (s, a, r) and its ticks'
# (s3, a3, r3: the fourth tenth); ARGV[6] and ARGV[11]: the ages of the starts answered 429 and clean.
# The trailing minute is summed from the tick ARGV[10] seconds back, as the SQLite budget sums it: the
# ticks of its first second, then whole seconds. KEYS[3]: the shared run's own schedule (used only with
# ARGV[13]). The budget's epoch is a field of KEYS[1] (ARGV[17] when it is made). The runs' registry:
# KEYS[4] (member -> "SEEN RUN_ID ENTRY") and KEYS[5] (member -> seen, to prune the lapsed); ARGV[18]
# the calling member ('' none), ARGV[19] its run, ARGV[20] its entry ('' none this time), ARGV[21] the
# lease; KEYS[6]: the calling run's stop. AHEAD (4): ARGV[22] starts reserved at once, each an interval
# after the one before (the last recorded as the key's last start), the first at least ARGV[24] seconds
# from now; ARGV[23]: the ages of the starts reserved ahead that went out, counted now. The live lane
# (gcra.py): ARGV[25] the caller's part of the key when it is a live one ('' none), ARGV[26] how long a
# live call keeps the lane open, ARGV[27] the slack of a far reservation's first start while it has room;
# ARGV[28] the caller's token (``Report.asker``), ARGV[29] how many far batch runs may queue; its fields
# in KEYS[1]: held, live_next, live_until, promised and promisee (the queue, space-separated).
STEP = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local interval, what = math.max(0, tonumber(ARGV[1])), tonumber(ARGV[2])
local pause_for, reason, pace = tonumber(ARGV[3]), ARGV[4], ARGV[5]
local max_ahead, max_pause, keep, minute = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local base = ARGV[12]
local share_interval = tonumber(ARGV[13])
local on_time, shared_seconds, tick = tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])
local count = math.max(1, tonumber(ARGV[22]) or 1)
local live, slack = tonumber(ARGV[25]) or 0, tonumber(ARGV[27])
local deferred = ''
if (what == 1 or what == 3 or what == 4) and share_interval ~= nil then
  local own = tonumber(redis.call('GET', KEYS[3])) or 0
  if own > now + share_interval + max_ahead then own = 0 end
  if own > now + on_time then
    deferred = string.format('%.6f', own - now)
    what = 0
  end
end
local s = redis.call('HMGET', KEYS[1], 'tat', 'paused_until', 'reason', 'pace', 'pace_version', 'last', 'pace_at',
  'updated', 'epoch', 'held', 'live_next', 'live_until', 'promised', 'promisee')
local epoch = s[9] or ARGV[17]
local promised, promisee = tonumber(s[13]) or 0, s[14] or ''
local held, live_next, live_until = tonumber(s[10]) or 0, tonumber(s[11]) or 0, tonumber(s[12]) or 0
local tat, paused_until = tonumber(s[1]) or 0, tonumber(s[2]) or 0
local old_reason, old_pace, version = s[3] or '', s[4] or '', tonumber(s[5]) or 0
local last, pace_at, updated = tonumber(s[6]) or 0, tonumber(s[7]) or 0, tonumber(s[8]) or 0
if now < updated then
  local back = now - updated
  tat, last, paused_until, pace_at = tat + back, last + back, paused_until + back, pace_at + back
  held, live_next, live_until, promised = held + back, live_next + back, live_until + back, promised + back
end
if tat > now + interval + max_ahead then tat = now end
if last > now + max_ahead then last = now - interval end
if held > now + max_ahead then held = 0 end
if paused_until > now + max_pause then paused_until = now end
if pause_for > 0 and now + pause_for > paused_until then
  paused_until = now + math.min(pause_for, max_pause)
  old_reason = reason
end
if pace ~= '' and (base == '' or tonumber(base) == version) then
  old_pace = pace; version = version + 1; pace_at = now
end
if live > 0 then live_until = now + tonumber(ARGV[26]) end
local at = nil
local committed, granted = '0', '0'
if what ~= 0 then
  local first = live > 0 and (what == 2 or live_next <= now + on_time)
  local due = math.max(last + interval, paused_until)
  if held > last and not (first and what == 2) then due = math.max(due, held + interval) end
  if what == 2 then
    if due > now + on_time then at = due else
      at = now; last = now; committed = '1'
      if first then granted = '1' end
    end
  else
    if first then live_next = math.max(live_next + interval / live, now); granted = '1' end
    local way_back = 0
    if what == 4 then way_back = tonumber(ARGV[24]) or 0 end
    if first then at = math.max(due, now + way_back) else at = math.max(tat, due, now + way_back) end
    local me = ''
    if live == 0 then me = ARGV[28] or '' end
    local queue = {}
    if what == 4 and not first and me ~= '' and live_until > now then
      for asker in string.gmatch(promisee, '%S+') do queue[#queue + 1] = asker end
      while #queue > 0 and now > promised + slack do
        table.remove(queue, 1)
        promised = promised + interval
      end
      promisee = table.concat(queue, ' ')
    end
    if what == 4 and not first and #queue > 0 and queue[1] ~= me then
      local turns = nil
      for i = 1, #queue do if queue[i] == me then turns = i - 1 end end
      if turns == nil then
        turns = #queue
        if #queue < tonumber(ARGV[29]) then queue[#queue + 1] = me end
      end
      promisee = table.concat(queue, ' ')
      deferred = string.format('%.6f', math.max(on_time, at + turns * interval - now - way_back - slack / 2))
      at = nil
    elseif what == 4 then
      if not first and live_until > now and live_next <= at and at > now + way_back + slack then
        deferred = string.format('%.6f', at - now - way_back - slack / 2)
        if me ~= '' then
          promised = at
          if #queue == 0 then promisee = me else promisee = table.concat(queue, ' ') end
        end
        at = nil
      else
        if #queue > 0 then
          promised = at + interval
          table.remove(queue, 1)
          promisee = table.concat(queue, ' ')
        end
        tat = at + count * interval
        last = at + (count - 1) * interval
      end
    else
      tat = math.max(tat, at) + interval
      if at <= now + on_time and what == 1 then
        at = now; last = now; committed = '1'
      elseif first then
        held = math.max(held, at)
      end
    end
  end
  if what ~= 2 and at ~= nil and share_interval ~= nil then
    redis.call('SET', KEYS[3], string.format('%.6f', at + share_interval), 'EX', keep)
  end
end
redis.call('HSET', KEYS[1], 'tat', string.format('%.6f', tat), 'paused_until', string.format('%.6f', paused_until),
  'reason', old_reason, 'pace', old_pace, 'pace_version', version, 'last', string.format('%.6f', last),
  'pace_at', string.format('%.6f', pace_at), 'updated', string.format('%.6f', now), 'epoch', epoch,
  'held', string.format('%.6f', held), 'live_next', string.format('%.6f', live_next),
  'live_until', string.format('%.6f', live_until), 'promised', string.format('%.6f', promised), 'promisee', promisee)
redis.call('EXPIRE', KEYS[1], 86400)
local stop = ''
if ARGV[18] ~= '' then
  if ARGV[20] ~= '' then
    local lease = tonumber(ARGV[21])
    redis.call('HSET', KEYS[4], ARGV[18], string.format('%.6f', now) .. ' ' .. ARGV[19] .. ' ' .. ARGV[20])
    redis.call('ZADD', KEYS[5], now, ARGV[18])
    local gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now - lease)
    if #gone > 0 then
      redis.call('HDEL', KEYS[4], unpack(gone))
      redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - lease)
    end
    redis.call('EXPIRE', KEYS[4], 86400)
    redis.call('EXPIRE', KEYS[5], 86400)
  end
  stop = redis.call('GET', KEYS[6]) or ''
end
local function tally(when, field)
  local ticks = math.floor(when / tick + 1e-9)
  local d = ticks % 10
  local k = KEYS[2] .. ':' .. ((ticks - d) / 10)
  redis.call('HINCRBY', k, field, 1)
  redis.call('HINCRBY', k, field .. d, 1)
  redis.call('EXPIRE', k, keep)
end
if committed == '1' then tally(now, 's') end
for age in string.gmatch(ARGV[23] or '', '%S+') do tally(now - tonumber(age), 's') end
for age in string.gmatch(ARGV[11], '%S+') do tally(now - tonumber(age), 'a') end
for age in string.gmatch(ARGV[6], '%S+') do tally(now - tonumber(age), 'r') end
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
  old_reason, old_pace, tostring(version), tostring(starts), tostring(refusals), deferred, committed, tostring(answers),
  epoch, stop, granted, live_until > now and '1' or '0'}
"""

# The runs on the key: members seen within ARGV[1] seconds, with their entries. Returns now, then
# (member, "SEEN RUN_ID ENTRY") pairs.
_LIVE_RUNS = string.Template("""
local members = redis.call('ZRANGEBYSCORE', $seen, now - tonumber($lease), '+inf')
if #members > 0 then
  local entries = redis.call('HMGET', $entries, unpack(members))
  for i = 1, #members do
    if entries[i] then
      table.insert($out, members[i])
      table.insert($out, entries[i])
    end
  end
end
""")


def live_runs(entries: str, seen: str, lease: str, out: str) -> str:
    """Lua appending to the table ``out`` the (member, entry) pairs of the runs' hash ``entries``
    whose members the sorted set ``seen`` saw within ``lease`` seconds before ``now``."""
    return _LIVE_RUNS.substitute(entries=entries, seen=seen, lease=lease, out=out)


RUNS = (
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local out = {string.format('%.6f', now)}
"""
    + live_runs("KEYS[1]", "KEYS[2]", "ARGV[1]", "out")
    + "return out\n"
)

# The key's counts of the last ARGV[1] seconds: each second's ticks as (tick, starts, answered, refused).
_TICKS = string.Template("""
for second = math.floor(now - tonumber($seconds)), math.floor(now) do
  local c = redis.call('HGETALL', $counts .. ':' .. second)
  if #c > 0 then
    local f = {}
    for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
    for d = 0, 9 do
      local st, a, r = f['s' .. d], f['a' .. d], f['r' .. d]
      if st or a or r then
        table.insert($out, tostring(second * 10 + d))
        table.insert($out, st or '0')
        table.insert($out, a or '0')
        table.insert($out, r or '0')
      end
    end
  end
end
""")


def ticks(counts: str, seconds: str, out: str) -> str:
    """Lua appending to the table ``out`` the ticks of the counts' hashes ``counts`` (``KEY:SECOND``)
    over the last ``seconds`` before ``now``: (tick, starts, answered, refused) for each tenth with any."""
    return _TICKS.substitute(counts=counts, seconds=seconds, out=out)


LEDGER = (
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local out = {string.format('%.6f', now)}
"""
    + ticks("KEYS[1]", "ARGV[1]", "out")
    + "return out\n"
)

# The lead of the key's search: granted to ARGV[1] when free, lapsed or its own; ARGV[2] its state
# to publish ('' none); ARGV[3] '1' to let it go. Returns holder, state, state_at, now.
LEAD = """
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

# The key's paid requests per period: one more in each period KEYS[i + 1] (kept ARGV[i + 3] seconds)
# unless the first holds the limit ARGV[1] already ('' none); or, before anything, unless the budget's
# epoch (a field of KEYS[1], made ARGV[3] when missing) is not ARGV[2], the one the caller knows ('' any):
# {-2, epoch}. Returns {1 if it counted else 0, the epoch, then each period's count}.
QUOTA = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then
  epoch = ARGV[3]
  redis.call('HSET', KEYS[1], 'epoch', epoch)
  redis.call('EXPIRE', KEYS[1], 86400)
end
if ARGV[2] ~= '' and ARGV[2] ~= epoch then return {-2, epoch} end
local counted = 1
if ARGV[1] ~= '' and tonumber(redis.call('GET', KEYS[2]) or '0') >= tonumber(ARGV[1]) then counted = 0 end
local out = {counted, epoch}
for i = 2, #KEYS do
  local n
  if counted == 1 then
    n = redis.call('INCR', KEYS[i])
    redis.call('EXPIRE', KEYS[i], math.ceil(tonumber(ARGV[i + 2])))
  else
    n = tonumber(redis.call('GET', KEYS[i]) or '0')
  end
  out[#out + 1] = n
end
return out
"""

# What a run saw counted on an old epoch ARGV[2], added to the counts now, once: KEYS[1] the budget's
# hash (its epoch must be ARGV[1], else {-2, epoch}; made ARGV[3] when missing), KEYS[2] what was restored
# of each old epoch (a hash of "EPOCH PERIOD" -> the count added for it), KEYS[i + 2] the period
# ARGV[3i + 1]'s count, raised by what ARGV[3i + 2] holds beyond what was restored of it already, kept
# ARGV[3i + 3] seconds. Returns {1, epoch}.
RESTORE = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then
  epoch = ARGV[3]
  redis.call('HSET', KEYS[1], 'epoch', epoch)
  redis.call('EXPIRE', KEYS[1], 86400)
end
if ARGV[1] ~= epoch then return {-2, epoch} end
local longest = 1
for i = 3, #KEYS do
  local at = 3 * (i - 2) + 1
  local field, count, keep = ARGV[2] .. ' ' .. ARGV[at], tonumber(ARGV[at + 1]), math.ceil(tonumber(ARGV[at + 2]))
  local done = tonumber(redis.call('HGET', KEYS[2], field) or '0')
  if count > done then
    redis.call('INCRBY', KEYS[i], count - done)
    if redis.call('TTL', KEYS[i]) < keep then redis.call('EXPIRE', KEYS[i], keep) end
    redis.call('HSET', KEYS[2], field, count)
  end
  longest = math.max(longest, keep)
end
if redis.call('TTL', KEYS[2]) < longest then redis.call('EXPIRE', KEYS[2], longest) end
return {1, epoch}
"""

GIVE_BACK = """
for i = 1, #KEYS do
  if tonumber(redis.call('GET', KEYS[i]) or '0') > 0 then redis.call('DECR', KEYS[i]) end
end
"""

# Entries remembered of a key written again with their own stamps, none over a newer one: KEYS[1] the
# record's hash (name -> "AT VALUE"), kept ARGV[1] seconds; KEYS[2] the budgets' names (ARGV[2] -> ARGV[3]);
# then (name, "AT VALUE") pairs.
REWRITE = """
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
for i = 4, #ARGV, 2 do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  local old_at = old and tonumber(string.match(old, '^(%S+)')) or nil
  if old_at == nil or old_at < tonumber(string.match(ARGV[i + 1], '^(%S+)')) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
"""
