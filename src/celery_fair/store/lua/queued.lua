-- celery-fair: the registry of tracked submissions (fair_track_submits), on its own keys.
--
-- KEYS (one hash tag, so one slot):
--   1 queued_by_key   zset, every score 0, read by lexical ranges: one entry per submission,
--                     '<bytes of key>:<key>|<time, %021.6f>|<task id>' (store/base.py,
--                     queued_member), so a key's entries are one range, in order of time
--   2 queued_by_time  zset  task id -> when it was tracked (the server's clock)
--   3 queued_entry    hash  task id -> its entry in queued_by_key
-- ARGV[1] is the operation:
--   track   key, task id, key limit ('' none), total limit ('' none), seconds to keep
--           -> {added 0/1, jobs of the key, jobs in all, '' | 'key' | 'total'}
--   untrack task id...                       -> how many were tracked
--   find    task id -> {} | {key, time, place in key, jobs of key, place, jobs in all}

local by_key, by_time, entries = KEYS[1], KEYS[2], KEYS[3]
local op = ARGV[1]

local function key_range(prefix)
  -- every entry of the key whose entries start with prefix: the time's digits follow it
  return '[' .. prefix, '(' .. prefix .. ':'
end

local function forget(id)
  local entry = redis.call('HGET', entries, id)
  if not entry then return 0 end
  redis.call('ZREM', by_key, entry)
  redis.call('ZREM', by_time, id)
  redis.call('HDEL', entries, id)
  return 1
end

if op == 'track' then
  local key, id = ARGV[2], ARGV[3]
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
  -- entries whose end was never reported (their worker's store call failed) lapse
  local old = redis.call('ZRANGEBYSCORE', by_time, '-inf', '(' .. (now - tonumber(ARGV[6])),
    'LIMIT', 0, 100)
  for _, stale in ipairs(old) do forget(stale) end
  local prefix = string.len(key) .. ':' .. key .. '|'
  local low, high = key_range(prefix)
  local in_key = redis.call('ZLEXCOUNT', by_key, low, high)
  local total = redis.call('ZCARD', by_time)
  if redis.call('HEXISTS', entries, id) == 1 then return {0, in_key, total, ''} end
  if ARGV[4] ~= '' and in_key >= tonumber(ARGV[4]) then return {0, in_key, total, 'key'} end
  if ARGV[5] ~= '' and total >= tonumber(ARGV[5]) then return {0, in_key, total, 'total'} end
  local entry = prefix .. string.format('%021.6f', now) .. '|' .. id
  redis.call('ZADD', by_key, 0, entry)
  redis.call('ZADD', by_time, now, id)
  redis.call('HSET', entries, id, entry)
  return {1, in_key, total, ''}
end

if op == 'untrack' then
  local n = 0
  for i = 2, #ARGV do n = n + forget(ARGV[i]) end
  return n
end

if op == 'find' then
  local id = ARGV[2]
  local entry = redis.call('HGET', entries, id)
  if not entry then return {} end
  local colon = string.find(entry, ':', 1, true)
  local length = tonumber(string.sub(entry, 1, colon - 1))
  local key = string.sub(entry, colon + 1, colon + length)
  local prefix = string.sub(entry, 1, colon + length + 1)
  local low, high = key_range(prefix)
  return {
    key,
    redis.call('ZSCORE', by_time, id),
    redis.call('ZLEXCOUNT', by_key, low, '[' .. entry),
    redis.call('ZLEXCOUNT', by_key, low, high),
    redis.call('ZRANK', by_time, id) + 1,
    redis.call('ZCARD', by_time),
  }
end

return redis.error_reply('queued.lua: unknown operation ' .. tostring(op))
