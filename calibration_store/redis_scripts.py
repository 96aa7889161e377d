"""The Redis store's Lua scripts: each change (put, rollback, delete) and the snapshot read is
one atomic script. Key layout and semantics: ``calibration_store.redis_store``.

COMMIT   KEYS seq, keys, then per profile: current, versions, profile:v{version}, counter;
         ARGV count, keep, channel, origin, then per profile: encoded key, version, JSON,
         profile key prefix. Every check comes before the first write, so a put of several
         profiles commits all or none: only when version > counter for every profile (else
         returns {-1, i, counter} for the first that moved; a replica may skip numbers to
         stay above the versions it has seen); then one rev for all, returned as
         {rev, v1, cur1, v2, cur2, ...}.
ROLLBACK KEYS seq, current, versions; ARGV encoded key, target (0 = previous), channel, origin.
DELETE   KEYS seq, keys, current, versions; ARGV encoded key, profile key prefix, channel,
         origin. The counter (the high-water mark) is kept.
RAISE    KEYS counters; ARGV versions: each counter raised to at least its version (a replica
         republishing the high-water marks it saw, after Redis lost them).
"""

from __future__ import annotations

COMMIT = """
local count = tonumber(ARGV[1])
for i = 0, count - 1 do
  local last = tonumber(redis.call('GET', KEYS[3 + 4 * i + 3]) or '0')
  if tonumber(ARGV[5 + 4 * i + 1]) <= last then return {-1, i, last} end
end
local rev = redis.call('INCR', KEYS[1])
local out = {rev}
local keep = tonumber(ARGV[2])
for i = 0, count - 1 do
  local current, versions = KEYS[3 + 4 * i], KEYS[4 + 4 * i]
  local doc, counter = KEYS[5 + 4 * i], KEYS[6 + 4 * i]
  local enc, v = ARGV[5 + 4 * i], tonumber(ARGV[6 + 4 * i])
  local json, prefix = ARGV[7 + 4 * i], ARGV[8 + 4 * i]
  redis.call('SET', counter, v)
  redis.call('SET', doc, json)
  local newest = redis.call('ZREVRANGE', versions, 0, 0)
  redis.call('ZADD', versions, v, v)
  redis.call('SADD', KEYS[2], enc)
  local cur = tonumber(redis.call('HGET', current, 'version') or '0')
  if cur == 0 or newest[1] == nil or tonumber(newest[1]) < v then
    cur = v
  end
  redis.call('HSET', current, 'version', cur, 'rev', rev)
  local n = redis.call('ZCARD', versions)
  if n > keep then
    for _, old in ipairs(redis.call('ZRANGE', versions, 0, n - keep - 1)) do
      if tonumber(old) ~= cur then
        redis.call('ZREM', versions, old)
        redis.call('DEL', prefix .. old)
      end
    end
  end
  redis.call('PUBLISH', ARGV[3], cjson.encode({op='put', key=enc, rev=rev, origin=ARGV[4]}))
  table.insert(out, v); table.insert(out, cur)
end
return out
"""

ROLLBACK = """
local cur = redis.call('HGET', KEYS[2], 'version')
if not cur then return {-1, 0} end
cur = tonumber(cur)
local target = tonumber(ARGV[2])
if target == 0 then
  local prev = redis.call('ZREVRANGEBYSCORE', KEYS[3], '(' .. cur, '-inf', 'LIMIT', 0, 1)
  if prev[1] == nil then return {-2, cur} end
  target = tonumber(prev[1])
elseif not redis.call('ZSCORE', KEYS[3], target) then
  return {-3, cur}
end
local rev = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], 'version', target, 'rev', rev)
redis.call('PUBLISH', ARGV[3], cjson.encode({op='rollback', key=ARGV[1], rev=rev, origin=ARGV[4]}))
return {target, rev}
"""

DELETE = """
local existed = redis.call('SREM', KEYS[2], ARGV[1]) + redis.call('EXISTS', KEYS[3])
for _, v in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  redis.call('DEL', ARGV[2] .. v)
end
redis.call('DEL', KEYS[3], KEYS[4])
if existed == 0 then return {0, 0} end
local rev = redis.call('INCR', KEYS[1])
redis.call('PUBLISH', ARGV[3], cjson.encode({op='delete', key=ARGV[1], rev=rev, origin=ARGV[4]}))
return {1, rev}
"""

# Atomic read of the current profile of the given encoded keys (all keys when none given),
# KEYS seq, keys, epoch: returns {seq, epoch ('' if none), E1, json1 ('' if the document is
# missing), counter1, E2, ...}; keys without a current pointer are left out.
SNAPSHOT = """
local out = {redis.call('GET', KEYS[1]) or '0', redis.call('GET', KEYS[3]) or ''}
local p = ARGV[1]
local keys = {}
if #ARGV == 1 then keys = redis.call('SMEMBERS', KEYS[2]) else keys = {unpack(ARGV, 2)} end
for _, e in ipairs(keys) do
  local v = redis.call('HGET', p .. ':current:' .. e, 'version')
  if v then
    table.insert(out, e)
    table.insert(out, redis.call('GET', p .. ':profile:' .. e .. ':v' .. v) or '')
    table.insert(out, redis.call('GET', p .. ':counter:' .. e) or '0')
  end
end
return out
"""

RAISE = """
for i, counter in ipairs(KEYS) do
  if tonumber(redis.call('GET', counter) or '0') < tonumber(ARGV[i]) then
    redis.call('SET', counter, ARGV[i])
  end
end
return 1
"""
