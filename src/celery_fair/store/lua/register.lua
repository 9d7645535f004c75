-- register: put back jobs this worker is running that the store no longer knows (after a
-- Redis restart without persistence, or after its lease expired during a long pause). The
-- jobs do run, so they count again even if that briefly puts a cap over its limit; a
-- conflict is taken back only if nobody else holds it. Jobs already known are left alone.
-- With a keep list, the jobs given and the uids kept (ended, their end not yet reported) are
-- all this worker has: every other job recorded under it is released (a release that a
-- failover to a replica lost).
-- ARGV: the common head (see common.lua), n, then n times:
--       uid, token ("high:low"), type, priority, conflict field, estimate field, fairness key, what its key
--       was charged, default cost, tenant, what its tenant was charged ('' = no tenant);
--       then, optionally, k and k uids to keep.
-- Returns {epoch, registered, released}.
-- Cost: O(n); with a keep list, O(n + k + running jobs of the fleet) (rare: the worker asks
-- only when the store counts more of its jobs than it runs).
local now = now_s()
local epoch = open_store(ARGV[H_SCHEMA], ARGV[H_EPOCH], now, tonumber(ARGV[H_RECOVERY]))
local worker = ARGV[H_WORKER]
renew(now, tonumber(ARGV[H_LEASE]), true)
local registered = 0
local n = tonumber(ARGV[HEAD + 1])
for i = 0, n - 1 do
  local b = HEAD + 2 + i * RUN_N
  local uid, toh, tok = ARGV[b + RUN_UID], parse_token(ARGV[b + RUN_TOKEN])
  if redis.call('HEXISTS', JOBS, uid) == 0 then
    local jtype, prio = ARGV[b + RUN_TYPE], ARGV[b + RUN_PRIORITY]
    local cf, ef, k = ARGV[b + RUN_CONFLICT], ARGV[b + RUN_ESTIMATE_KEY], ARGV[b + RUN_FAIRNESS_KEY]
    count(prio, jtype, 1)
    if cf ~= '' then
      if redis.call('HEXISTS', CONFLICTS, cf) == 0 then
        redis.call('HSET', CONFLICTS, cf, uid)
      else
        cf = ''  -- someone else holds it: this job must not release it
      end
    end
    local tn, tst = nil, nil
    if ARGV[b + RUN_TENANT_CHARGE] ~= '' then tn, tst = ARGV[b + RUN_TENANT], ARGV[b + RUN_TENANT_CHARGE] end
    if key_active(k) and ARGV[H_ADVANCE_IDLE] == '1' then  -- running again: among the least
      local acc = redis.call('HGET', ACC, k) or '0'
      if tn then
        redis.call('ZADD', TEN.KMIN, 0, TEN.member(tn, k, tonumber(acc)))
      else
        redis.call('ZADD', MINACC, acc, k)
      end
    end
    if tn and TEN.running(tn) and ARGV[H_ADVANCE_IDLE] == '1' then
      redis.call('ZADD', TEN.MINACC, redis.call('HGET', TEN.ACC, tn) or '0', tn)
    end
    raise_token(toh, tok)  -- later tokens go above it
    redis.call('HSET', JOBS, uid, cmsgpack.pack({
      w = worker, toh = toh, tok = tok, t = jtype, p = prio, c = cf, e = ef, k = k,
      est = ARGV[b + RUN_ESTIMATE], d = ARGV[b + RUN_DEFAULT_COST], at = fmt(now), tn = tn,
      tst = tst}))
    mine = mine + 1
    registered = registered + 1
  end
end
local released = 0
local kb = HEAD + 2 + n * RUN_N
local k = tonumber(ARGV[kb] or '')
if k then
  local keep = {}
  for i = 0, n - 1 do keep[ARGV[HEAD + 2 + i * RUN_N + RUN_UID]] = true end
  for i = 1, k do keep[ARGV[kb + i]] = true end
  local snow = fmt(now)
  local all = redis.call('HGETALL', JOBS)
  for i = 1, #all, 2 do
    if not keep[all[i]] then
      local rec = cmsgpack.unpack(all[i + 1])
      if rec.w == worker then
        drop_job(all[i], rec, snow)
        mine = mine - 1
        released = released + 1
      end
    end
  end
end
close_store()
return {epoch, registered, released}
