-- celery-fair: the registry of tracked submissions (fair_track_submits), on its own keys.
--
-- KEYS (one hash tag, so one slot):
--   1 queued_by_key   zset, every score 0, read by lexical ranges: one entry per submission,
--                     '<bytes of key>:<key>|<time, %021.6f>|<task id>' (store/base.py,
--                     queued_member), so a key's entries are one range, in order of time
--   2 queued_by_time  zset  task id -> when it was tracked (the server's clock)
--   3 queued_entry    hash  task id -> its entry in queued_by_key
--   4 queued_rate     hash  fairness key -> 'n|since|last': n of its tracked jobs ended
--                     between since and last (store/base.py, rate_after: the same record)
--   5 queued_refused  hash  'key' | 'total' -> submits a limit refused, ever (QueueFull)
-- ARGV[1] is the operation:
--   track   key, task id, key limit ('' none), total limit ('' none), seconds to keep
--           -> {added 0/1, jobs of the key, jobs in all, '' | 'key' | 'total'}
--   untrack task id...                       -> how many were tracked
--   withdraw task id...  (their publish failed: forgotten, not counted as ends)
--                                            -> how many were tracked
--   find    task id -> {} | {key, time, place in key, jobs of key, place, jobs in all,
--           its key's ends per second lately ('0': not known)}
--   list    'key' and a key, or 'all' and '', then a limit
--           -> {how many, entry...}: the oldest entries (of the key), oldest first

local by_key, by_time, entries, rates, refused = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local op = ARGV[1]
local WINDOW = 60.0  -- store/base.py, RATE_WINDOW

local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6
end

-- The fairness key of an entry ('<bytes of key>:<key>|...'), and the entry's prefix.
local function key_of(entry)
  local colon = string.find(entry, ':', 1, true)
  local length = tonumber(string.sub(entry, 1, colon - 1))
  return string.sub(entry, colon + 1, colon + length), string.sub(entry, 1, colon + length + 1)
end

local function read_rate(key)
  local raw = redis.call('HGET', rates, key)
  if not raw then return nil end
  local n, since, last = string.match(raw, '^([^|]+)|([^|]+)|([^|]+)$')
  return {tonumber(n), tonumber(since), tonumber(last)}
end

-- store/base.py, rate_after
local function rate_after(rec, ended, now)
  if rec == nil or now - rec[3] > WINDOW then return {ended, now, now} end
  local n, since = rec[1] + ended, rec[2]
  if now - since > WINDOW then
    n = n * (WINDOW / 2) / (now - since)
    since = now - WINDOW / 2
  end
  return {n, since, now}
end

-- store/base.py, service_rate
local function service_rate(rec, now)
  if rec == nil then return 0 end
  local n, since, last = rec[1], rec[2], rec[3]
  if n < 2 or now - since < 1.0 or now - last > WINDOW then return 0 end
  return (n - 1) / (now - since)
end

local function key_range(prefix)
  -- every entry of the key whose entries start with prefix: the time's digits follow it
  return '[' .. prefix, '(' .. prefix .. ':'
end

-- Forget a submission; returns its entry, or nil if it was not tracked.
local function forget(id)
  local entry = redis.call('HGET', entries, id)
  if not entry then return nil end
  redis.call('ZREM', by_key, entry)
  redis.call('ZREM', by_time, id)
  redis.call('HDEL', entries, id)
  return entry
end

if op == 'track' then
  local key, id = ARGV[2], ARGV[3]
  local now = server_now()
  -- entries whose end was never reported (their worker's store call failed) lapse
  local old = redis.call('ZRANGEBYSCORE', by_time, '-inf', '(' .. (now - tonumber(ARGV[6])),
    'LIMIT', 0, 100)
  for _, stale in ipairs(old) do forget(stale) end
  local prefix = string.len(key) .. ':' .. key .. '|'
  local low, high = key_range(prefix)
  local in_key = redis.call('ZLEXCOUNT', by_key, low, high)
  local total = redis.call('ZCARD', by_time)
  if redis.call('HEXISTS', entries, id) == 1 then return {0, in_key, total, ''} end
  if ARGV[4] ~= '' and in_key >= tonumber(ARGV[4]) then
    redis.call('HINCRBY', refused, 'key', 1)
    return {0, in_key, total, 'key'}
  end
  if ARGV[5] ~= '' and total >= tonumber(ARGV[5]) then
    redis.call('HINCRBY', refused, 'total', 1)
    return {0, in_key, total, 'total'}
  end
  local entry = prefix .. string.format('%021.6f', now) .. '|' .. id
  redis.call('ZADD', by_key, 0, entry)
  redis.call('ZADD', by_time, now, id)
  redis.call('HSET', entries, id, entry)
  return {1, in_key, total, ''}
end

if op == 'withdraw' then
  local n = 0
  for i = 2, #ARGV do
    if forget(ARGV[i]) then n = n + 1 end
  end
  return n
end

if op == 'untrack' then
  local n, ended = 0, {}
  for i = 2, #ARGV do
    local entry = forget(ARGV[i])
    if entry then
      n = n + 1
      local key = key_of(entry)
      ended[key] = (ended[key] or 0) + 1
    end
  end
  if n > 0 then
    local now = server_now()
    for key, count in pairs(ended) do
      local rec = rate_after(read_rate(key), count, now)
      redis.call('HSET', rates, key,
        string.format('%.6f|%.6f|%.6f', rec[1], rec[2], rec[3]))
    end
  end
  return n
end

if op == 'find' then
  local id = ARGV[2]
  local entry = redis.call('HGET', entries, id)
  if not entry then return {} end
  local key, prefix = key_of(entry)
  local low, high = key_range(prefix)
  return {
    key,
    redis.call('ZSCORE', by_time, id),
    redis.call('ZLEXCOUNT', by_key, low, '[' .. entry),
    redis.call('ZLEXCOUNT', by_key, low, high),
    redis.call('ZRANK', by_time, id) + 1,
    redis.call('ZCARD', by_time),
    string.format('%.6f', service_rate(read_rate(key), server_now())),
  }
end

if op == 'list' then
  local limit = tonumber(ARGV[4])
  if ARGV[2] == 'key' then
    local low, high = key_range(string.len(ARGV[3]) .. ':' .. ARGV[3] .. '|')
    local out = {redis.call('ZLEXCOUNT', by_key, low, high)}
    if limit > 0 then
      for _, entry in ipairs(redis.call('ZRANGEBYLEX', by_key, low, high, 'LIMIT', 0, limit)) do
        out[#out + 1] = entry
      end
    end
    return out
  end
  local out = {redis.call('ZCARD', by_time)}
  if limit > 0 then
    local ids = redis.call('ZRANGE', by_time, 0, limit - 1)
    if #ids > 0 then
      for _, entry in ipairs(redis.call('HMGET', entries, unpack(ids))) do
        if entry then out[#out + 1] = entry end
      end
    end
  end
  return out
end

return redis.error_reply('queued.lua: unknown operation ' .. tostring(op))
