-- admit: one round trip of a worker's exchange with the fleet: release the jobs it finished,
-- then try a batch of pending jobs, in the caller's order, against the fleet-wide state.
-- ARGV: the common head (see common.lua), then
--       d, and d times: uid, token, elapsed ('' = none), final ('1'/'0')   (as complete.lua);
--       n, and n times: uid, type, priority, tier cap, type cap ('' = none), conflict field
--          ('' = none), estimate field, fairness key, cost ('' = learned), default cost;
--       then any number of conflict fields to watch.
-- Each job is admitted when its tier and its type run fewer than their caps and nobody holds
-- its conflict; a blocked job does not stop the ones after it. An admitted job gets the next
-- fencing token, is charged its estimate, and is held under this worker's lease.
-- Returns {epoch, now, {status, estimate} per finished job, {status, token, estimate,
--          accumulated} per job, tiers, types, {1/0 held per watched conflict}, live workers};
-- a job's status is ok, tier, type, conflict, running (its uid runs now on a live lease),
-- done (its uid finished for good within the dedupe window) or recovering.
-- Cost: O(d + n + watched + 8 dead workers' jobs + housekeeping bounded at 64 per kind).
local now = now_s()
local epoch, recovering = open_store(ARGV[1], ARGV[2], now, tonumber(ARGV[5]))
local worker, lease = ARGV[3], tonumber(ARGV[4])
local advance = ARGV[9] == '1'
local est_ttl = optnum(ARGV[7])
local dedupe = tonumber(ARGV[11]) > 0
reclaim(now, 8)
maintain(now, optnum(ARGV[6]), est_ttl, optnum(ARGV[8]))
redis.call('ZADD', WORKERS, fmt(now + lease), worker)

local d = tonumber(ARGV[HEAD + 1])
local finished = finish_jobs(HEAD + 2, d, now)

local results = {}
local at = HEAD + 2 + d * 4
local n = tonumber(ARGV[at])
for i = 0, n - 1 do
  local b = at + 1 + i * 10
  local uid, jtype, prio = ARGV[b], ARGV[b + 1], ARGV[b + 2]
  local tier_cap, type_cap = optnum(ARGV[b + 3]), optnum(ARGV[b + 4])
  local cf, ef, k = ARGV[b + 5], ARGV[b + 6], ARGV[b + 7]
  local cost, default = optnum(ARGV[b + 8]), tonumber(ARGV[b + 9])
  local status = 'ok'
  if recovering then
    status = 'recovering'
  elseif redis.call('HEXISTS', JOBS, uid) == 1 then
    status = 'running'
  elseif dedupe and redis.call('ZSCORE', DONE, uid) then
    status = 'done'
  elseif tier_cap and tonumber(redis.call('HGET', TIERS, prio) or '0') >= tier_cap then
    status = 'tier'
  elseif type_cap and tonumber(redis.call('HGET', TYPES, jtype) or '0') >= type_cap then
    status = 'type'
  elseif cf ~= '' and redis.call('HEXISTS', CONFLICTS, cf) == 1 then
    status = 'conflict'
  end
  if status == 'ok' then
    local est = cost
    if est == nil then
      est = tonumber(redis.call('HGET', EST, ef) or '')
      if est == nil then
        est = default
      elseif est_ttl then
        redis.call('ZADD', ESTSEEN, fmt(now), ef)
      end
    end
    local acc = tonumber(redis.call('HGET', ACC, k) or '0')
    if advance and redis.call('HEXISTS', ACTIVE, k) == 0 then
      local low = redis.call('ZRANGE', MINACC, 0, 0, 'WITHSCORES')
      if low[2] and tonumber(low[2]) > acc then acc = tonumber(low[2]) end
    end
    acc = acc + est
    redis.call('HSET', ACC, k, fmt(acc))
    if advance then redis.call('ZADD', MINACC, fmt(acc), k) end
    key_active(k)
    local token = redis.call('HINCRBY', META, 'token', 1)
    redis.call('HINCRBY', TIERS, prio, 1)
    redis.call('HINCRBY', TYPES, jtype, 1)
    if cf ~= '' then redis.call('HSET', CONFLICTS, cf, uid) end
    redis.call('HSET', JOBS, uid, cmsgpack.pack({
      w = worker, tok = token, t = jtype, p = prio, c = cf, e = ef, k = k,
      est = fmt(est), d = fmt(default), at = fmt(now)}))
    redis.call('ZADD', BYWORKER, 0, worker .. '\0' .. uid)
    results[#results + 1] = {'ok', token, fmt(est), fmt(acc)}
  else
    results[#results + 1] = {status, 0, '', redis.call('HGET', ACC, k) or '0'}
  end
end

local held = {}
for i = at + 1 + n * 10, #ARGV do held[#held + 1] = redis.call('HEXISTS', CONFLICTS, ARGV[i]) end
local tiers, types = counts()
return {epoch, fmt(now), finished, results, tiers, types, held, redis.call('ZCARD', WORKERS)}
