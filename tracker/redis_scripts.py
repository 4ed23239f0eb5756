"""The Lua scripts of the Redis store's swarm (tracker.store_redis): one announce is one script (one round
trip, atomic across replicas), and so is each step of the sweep of the tracker-wide sets.

An interop-passkey announce is refused unless a blob's metainfo has its infohash (the index key
`ih:<infohash>`). An announce counts against `SwarmLimits` in three sorted sets scored by expiry,
members infohash + peer id: the announcing address's entries with its passkey, and every entry with
each passkey; and the swarms in one more (members infohashes). A new entry over a limit is refused
before anything is written. Every set is trimmed a bounded number of members per step: Redis runs one
script at a time, so one that read a whole set would stall every replica.
"""

from __future__ import annotations

NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""
"""Lua: `now`, in ms, by Redis's clock. Every expiry and stall age is on that one clock: replicas' own
clocks may differ, or be stepped, and a peer one replica stores would expire at once for another."""

ANNOUNCE = (
    NOW
    + """
-- pa: this address's entries with this passkey, cls / oth: every entry with this passkey / the other
-- (members infohash .. peer id, scored by expiry): what the limits count.
-- known: the infohash's entry in the metainfo's index (tracker.store_redis), without which the interop
-- passkey announces nothing.
local s, l, a, d, t, ips, pa, cls, oth, known = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6],
  KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local pid, addr, seeder, event = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local numwant, ttl, ih = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local max_swarms, max_class, per_address, max_peers =
  tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
if ARGV[8] ~= '1' and redis.call('EXISTS', known) == 0 then return {-1, 'unregistered', {}} end
local function trim(key, hash, most)
  -- A bounded step (never a whole key at once): each announce adds at most one member.
  local dead = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, most or 100)
  if #dead > 0 then
    redis.call('ZREM', key, unpack(dead))
    if hash then redis.call('HDEL', hash, unpack(dead)) end
  end
end
trim(s, a, 1000)
trim(l, a, 1000)
local member = ih .. pid
if event == 'stopped' then
  redis.call('ZREM', s, pid)
  redis.call('ZREM', l, pid)
  redis.call('HDEL', a, pid)
  redis.call('ZREM', pa, member)
  redis.call('ZREM', cls, member)
  return {redis.call('ZCARD', s), redis.call('ZCARD', l), {}}
end
local held = redis.call('ZSCORE', pa, member)
if not held or tonumber(held) <= now then
  -- A new entry for this address and passkey: refused, storing nothing, over a limit.
  if redis.call('EXISTS', s) == 0 and redis.call('EXISTS', l) == 0 then
    trim(t)
    if redis.call('ZCARD', t) >= max_swarms then return {-1, 'swarms', {}} end
  end
  trim(pa)
  trim(cls)
  trim(oth)
  local class = redis.call('ZCARD', cls)
  if class >= max_class or class + redis.call('ZCARD', oth) >= max_peers then return {-1, 'peers', {}} end
  if redis.call('ZCARD', pa) >= per_address then return {-1, 'address', {}} end
end
local mine, other = l, s
if seeder == '1' then mine, other = s, l end
redis.call('ZREM', other, pid)
redis.call('ZADD', mine, now + ttl, pid)
redis.call('HSET', a, pid, addr)
if event == 'completed' then redis.call('INCR', d) end
redis.call('ZADD', t, now + ttl, ih)
redis.call('ZADD', pa, now + ttl, member)
redis.call('ZADD', cls, now + ttl, member)
for _, key in ipairs({s, l, a, d, t, pa, cls}) do redis.call('PEXPIRE', key, ttl) end
if ARGV[8] == '1' then redis.call('ZADD', ips, now + ttl, string.sub(addr, 1, -3)) end
local out, n = {}, 0
if numwant > 0 then
  local sources = {s, l}
  if seeder == '1' then sources = {l} end
  for _, key in ipairs(sources) do
    if n >= numwant then break end
    local ids = redis.call('ZRANDMEMBER', key, numwant - n + 1)
    for _, id in ipairs(ids) do
      if id ~= pid and n < numwant then
        local ad = redis.call('HGET', a, id)
        if ad then
          out[#out + 1] = id
          out[#out + 1] = ad
          n = n + 1
        end
      end
    end
  end
end
return {redis.call('ZCARD', s), redis.call('ZCARD', l), out}
"""
)

TRIM = (
    NOW
    + """
-- Expired members of the tracker-wide sets, at most ARGV[1] of each (a bounded step: Redis runs one
-- script at a time). Swarms' own keys expire by their PEXPIRE.
local most, removed = tonumber(ARGV[1]), 0
for _, key in ipairs(KEYS) do
  local dead = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, most)
  if #dead > 0 then redis.call('ZREM', key, unpack(dead)) end
  removed = math.max(removed, #dead)
end
return removed
"""
)
