"""The Redis store's Lua scripts: each change (put, rollback, delete) and the snapshot read is
one atomic script. Key layout and semantics: ``calibration_store.redis_store``.

COMMIT   KEYS seq, keys, current, versions, profile:v{version}, counter;
         ARGV encoded key, version, JSON, keep, profile key prefix, channel, origin.
         Commits only when version == counter + 1 (else returns {-1, counter, 0}).
ROLLBACK KEYS seq, current, versions; ARGV encoded key, target (0 = previous), channel, origin.
DELETE   KEYS seq, keys, current, versions; ARGV encoded key, profile key prefix, channel,
         origin. The counter (the high-water mark) is kept.
"""

from __future__ import annotations

COMMIT = """
local v = tonumber(ARGV[2])
local last = tonumber(redis.call('GET', KEYS[6]) or '0')
if last + 1 ~= v then return {-1, last, 0} end
redis.call('SET', KEYS[6], v)
redis.call('SET', KEYS[5], ARGV[3])
local newest = redis.call('ZREVRANGE', KEYS[4], 0, 0)
redis.call('ZADD', KEYS[4], v, v)
redis.call('SADD', KEYS[2], ARGV[1])
local rev = redis.call('INCR', KEYS[1])
local cur = tonumber(redis.call('HGET', KEYS[3], 'version') or '0')
if cur == 0 or newest[1] == nil or tonumber(newest[1]) < v then
  cur = v
end
redis.call('HSET', KEYS[3], 'version', cur, 'rev', rev)
local keep = tonumber(ARGV[4])
local n = redis.call('ZCARD', KEYS[4])
if n > keep then
  for _, old in ipairs(redis.call('ZRANGE', KEYS[4], 0, n - keep - 1)) do
    if tonumber(old) ~= cur then
      redis.call('ZREM', KEYS[4], old)
      redis.call('DEL', ARGV[5] .. old)
    end
  end
end
redis.call('PUBLISH', ARGV[6], cjson.encode({op='put', key=ARGV[1], rev=rev, origin=ARGV[7]}))
return {v, rev, cur}
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

# Atomic read of the current profile of the given encoded keys (all keys when none given):
# returns {seq, E1, rev1, json1, E2, ...}; keys without a current profile are left out.
SNAPSHOT = """
local out = {redis.call('GET', KEYS[1]) or '0'}
local p = ARGV[1]
local keys = {}
if #ARGV == 1 then keys = redis.call('SMEMBERS', KEYS[2]) else keys = {unpack(ARGV, 2)} end
for _, e in ipairs(keys) do
  local h = redis.call('HMGET', p .. ':current:' .. e, 'version', 'rev')
  if h[1] then
    local doc = redis.call('GET', p .. ':profile:' .. e .. ':v' .. h[1])
    if doc then
      table.insert(out, e); table.insert(out, h[2]); table.insert(out, doc)
    end
  end
end
return out
"""
