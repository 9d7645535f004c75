-- celery-fair: helpers shared by every script (prepended to each one when it is loaded).
--
-- KEYS, the same fixed list for every script, all under one hash tag so one slot holds them:
--   1 meta      hash  schema, epoch, token (last fencing token), reset_at, recovering_until
--   2 tiers     hash  priority -> running jobs of that tier, fleet-wide
--   3 types     hash  job type -> running jobs of that type
--   4 conflicts hash  conflict field -> uid of the job that holds it
--   5 jobs      hash  uid -> cmsgpack record {w, tok, t, p, c, e, k, est, d, at}
--   6 byworker  zset  "worker\0uid" at score 0, for a worker's jobs by lexicographic range
--   7 workers   zset  worker -> lease expiry (Redis server time, seconds)
--   8 acc       hash  fairness key -> accumulated cost
--   9 seen      zset  idle fairness key -> when it became idle (for the TTL)
--  10 active    hash  fairness key -> its running jobs (keys with at least one)
--  11 est       hash  estimate field -> learned estimate
--  12 estseen   zset  estimate field -> when it was last used or updated
--  13 minacc    zset  active fairness key -> accumulated cost (for advance_idle)
--  14 done      zset  uid of a job that finished for good -> when (a tombstone, for dedupe)
-- ARGV of every script starts with the same head (HEAD = 11 values): schema, the epoch the
-- caller last saw ('' for none), worker, lease seconds, recovery window seconds, cost_ttl,
-- estimate_ttl, reset_interval ('' = none for these three), advance_idle ('1' or '0'), alpha,
-- dedupe seconds (how long a tombstone is kept; '0' = none); then its own.
-- Numbers cross the script boundary as strings in %.17g, which round-trips a double exactly,
-- so the estimate rule computes bit for bit what the Python core computes.

local META, TIERS, TYPES, CONFLICTS, JOBS, BYWORKER, WORKERS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local ACC, SEEN, ACTIVE, EST, ESTSEEN, MINACC = KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local DONE = KEYS[14]
local HEAD = 11

local function fmt(x) return string.format('%.17g', x) end

local function now_s()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function optnum(s) if s == '' then return nil end return tonumber(s) end

-- Check the schema and create the meta record when the store is empty. ``expected`` is the
-- epoch the caller last saw ('' for none). A store that has gone (a Redis restart without
-- persistence) while a caller remembers it opens a recovery window of ``window`` seconds in
-- which nothing is admitted, so every worker can register its running jobs first.
local function open_store(schema, expected, now, window)
  local m = redis.call('HMGET', META, 'schema', 'epoch', 'recovering_until')
  if m[1] == false then
    local epoch = fmt(now) .. ':' .. tostring(math.random(1, 1000000000))
    redis.call('HSET', META, 'schema', schema, 'epoch', epoch, 'token', '0')
    if expected ~= '' then
      redis.call('HSET', META, 'recovering_until', fmt(now + window))
      return epoch, true
    end
    return epoch, false
  end
  if m[1] ~= schema then
    error({err = 'celery-fair: the store at ' .. META .. ' has schema ' .. m[1] ..
      '; this celery-fair speaks schema ' .. schema .. '. Use another fair_store_prefix ' ..
      'or upgrade every worker.'})
  end
  local until_ = tonumber(m[3] or '')
  return m[2], (until_ ~= nil and now < until_)
end

local function counts()
  return redis.call('HGETALL', TIERS), redis.call('HGETALL', TYPES)
end

local function key_active(k)
  redis.call('HINCRBY', ACTIVE, k, 1)
  redis.call('ZREM', SEEN, k)
end

local function key_idle(k, now)
  if redis.call('HINCRBY', ACTIVE, k, -1) <= 0 then
    redis.call('HDEL', ACTIVE, k)
    redis.call('ZREM', MINACC, k)
    if redis.call('HEXISTS', ACC, k) == 1 then
      redis.call('ZADD', SEEN, fmt(now), k)
    end
  end
end

-- Release one running job: its counts, its conflict (only if it holds it), its key.
local function drop_job(uid, rec, now)
  if redis.call('HINCRBY', TIERS, rec.p, -1) <= 0 then redis.call('HDEL', TIERS, rec.p) end
  if redis.call('HINCRBY', TYPES, rec.t, -1) <= 0 then redis.call('HDEL', TYPES, rec.t) end
  if rec.c ~= '' and redis.call('HGET', CONFLICTS, rec.c) == uid then
    redis.call('HDEL', CONFLICTS, rec.c)
  end
  redis.call('HDEL', JOBS, uid)
  redis.call('ZREM', BYWORKER, rec.w .. '\0' .. uid)
  key_idle(rec.k, now)
end

-- Release every job of every worker whose lease has expired. At most ``limit`` workers.
local function reclaim(now, limit)
  local dead = redis.call('ZRANGEBYSCORE', WORKERS, '-inf', '(' .. fmt(now), 'LIMIT', 0, limit)
  local n = 0
  for _, w in ipairs(dead) do
    local members = redis.call('ZRANGEBYLEX', BYWORKER, '[' .. w .. '\0', '[' .. w .. '\1')
    for _, m in ipairs(members) do
      local uid = string.sub(m, #w + 2)
      local packed = redis.call('HGET', JOBS, uid)
      if packed then
        drop_job(uid, cmsgpack.unpack(packed), now)
        n = n + 1
      else
        redis.call('ZREM', BYWORKER, m)
      end
    end
    redis.call('ZREM', WORKERS, w)
  end
  return n
end

-- Forget the members of ``hash`` whose time in ``since`` is older than ``ttl``; at most ``limit``.
local function expire(hash, since, now, ttl, limit)
  local old = redis.call('ZRANGEBYSCORE', since, '-inf', fmt(now - ttl), 'LIMIT', 0, limit)
  for _, field in ipairs(old) do
    redis.call('HDEL', hash, field)
    redis.call('ZREM', since, field)
  end
end

-- Bounded housekeeping: TTLs of idle keys, unused estimates and tombstones (at most ``limit``
-- evictions of each per call), and the periodic reset.
local function maintain(now, cost_ttl, est_ttl, reset_interval, limit)
  limit = limit or 64
  if cost_ttl then expire(ACC, SEEN, now, cost_ttl, limit) end
  if est_ttl then expire(EST, ESTSEEN, now, est_ttl, limit) end
  local dedupe = tonumber(ARGV[11])
  if dedupe > 0 then
    local old = redis.call('ZRANGEBYSCORE', DONE, '-inf', fmt(now - dedupe), 'LIMIT', 0, limit)
    if #old > 0 then redis.call('ZREM', DONE, unpack(old)) end
  end
  if reset_interval then
    local at = tonumber(redis.call('HGET', META, 'reset_at') or '')
    if at == nil then
      redis.call('HSET', META, 'reset_at', fmt(now + reset_interval))
    elseif now >= at then
      while at <= now do at = at + reset_interval end
      redis.call('HSET', META, 'reset_at', fmt(at))
      redis.call('DEL', ACC, SEEN)
      local active = redis.call('ZRANGE', MINACC, 0, -1)
      for _, k in ipairs(active) do redis.call('ZADD', MINACC, 0, k) end
    end
  end
end

-- Finish ``n`` running jobs given as (uid, token, elapsed, final) from ARGV[b]: each fenced by
-- its token; with an elapsed time the estimate learns alpha * elapsed + (1 - alpha) * previous;
-- a final one leaves a tombstone. Returns {status, estimate} per job; status ok or stale.
local function finish_jobs(b, n, now)
  local alpha, est_ttl, dedupe = tonumber(ARGV[10]), optnum(ARGV[7]), tonumber(ARGV[11])
  local results = {}
  for i = 0, n - 1 do
    local at = b + i * 4
    local uid, token, elapsed = ARGV[at], tonumber(ARGV[at + 1]), optnum(ARGV[at + 2])
    local packed = redis.call('HGET', JOBS, uid)
    local rec = packed and cmsgpack.unpack(packed)
    if not rec or rec.tok ~= token then
      results[#results + 1] = {'stale', ''}
    else
      local prev = tonumber(redis.call('HGET', EST, rec.e) or '')
      if prev == nil then prev = tonumber(rec.d) end
      local value = prev
      if elapsed then
        value = alpha * elapsed + (1 - alpha) * prev
        redis.call('HSET', EST, rec.e, fmt(value))
        if est_ttl then redis.call('ZADD', ESTSEEN, fmt(now), rec.e) end
      end
      drop_job(uid, rec, now)
      if dedupe > 0 and ARGV[at + 3] == '1' then redis.call('ZADD', DONE, fmt(now), uid) end
      results[#results + 1] = {'ok', fmt(value)}
    end
  end
  return results
end
