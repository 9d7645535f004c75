-- admit: one round trip of a worker's exchange with the fleet: release the jobs it finished,
-- then try a batch of pending jobs, in the caller's order, against the fleet-wide state.
-- ARGV: the common head (see common.lua), then
--       d, and d times: uid, token, elapsed ('' = none), how ('1'/'u'/'0')   (as complete.lua);
--       n, and n times: uid, type, priority, tier cap, type cap ('' = none), conflict field
--          ('' = none), estimate field, fairness key, cost ('' = learned), default cost,
--          key cap ('' = none), weight, claim ('' = none), rate ('' = none), burst,
--          per cost ('1'/'0'), type rate ('' = none), type burst, type per cost, tenant,
--          tenant weight ('' = no tenant: flat keys), tenant cap ('' = none), tenant rate
--          ('' = none), tenant burst, tenant per cost
--          (as Ask's fields, store/wire.py);
--       then any number of conflict fields to watch.
-- Each job gets the first verdict that applies (order: see Store.admit, store/base.py); a
-- refused job does not stop the ones after it. A slot that an urgent job's claim holds
-- (common.lua, CLAIMS) counts as taken for every other job. An admitted job gets the next
-- fencing token, its key is charged its estimate / weight (and its tenant estimate / tenant
-- weight: charge_key, TEN.charge), and it is held under this worker's lease, which the call
-- renews when a quarter of it has passed since the last renewal.
-- Returns {epoch, now, {status, estimate} per finished job, {status, token high, token low,
--          estimate, accumulated, key's bucket level ('' = no rate), type's bucket level ('' = no
--          rate), tenant's accumulated ('' = no tenant), tenant's bucket level ('' = no
--          rate)} per job (the token's halves: wire.py,
--          0 and 0 unless ok), tiers, types, {1/0 held per watched conflict}, live workers,
--          {key, running} flat for each key asked with a cap, {tenant, running} likewise};
-- a finished job's status is F_APPLIED or F_STALE (as complete.lua), a job's is its verdict,
-- V_<NAME> for Verdict.<NAME> (both generated from store/wire.py).
-- Cost: O(d + n + watched), plus housekeeping bounded at 64 per kind at most every
-- MAINTAIN_EVERY seconds across the fleet, with which it also reclaims the jobs of up to 8
-- dead workers (O(running jobs) when some died).
local now = now_s()
local snow = fmt(now)
local epoch, recovering = open_store(ARGV[H_SCHEMA], ARGV[H_EPOCH], now, tonumber(ARGV[H_RECOVERY]))
local worker, lease = ARGV[H_WORKER], tonumber(ARGV[H_LEASE])
local advance = ARGV[H_ADVANCE_IDLE] == '1'
local est_ttl = optnum(ARGV[H_ESTIMATE_TTL])
local dedupe = tonumber(ARGV[H_DEDUPE]) > 0
if now >= maint_at then reclaim(now, 8) end  -- with the housekeeping, as throttled
maintain(now, optnum(ARGV[H_COST_TTL]), est_ttl, optnum(ARGV[H_RESET_INTERVAL]), 64, MAINTAIN_EVERY)
renew(now, lease, false)
-- Pauses are fields of POLICIES beside its 'version' and 'doc' (policies.lua writes those two
-- with any pause): with two fields or fewer nothing is paused, and no ask looks.
local pauses = redis.call('HLEN', POLICIES) > 2

local d = tonumber(ARGV[HEAD + 1])
local finished = finish_jobs(HEAD + 2, d, now, snow)

local results = {}
local capped = {}  -- the fairness keys asked for with a cap: their running counts go back
local tcapped = {}  -- and the tenants
local at = HEAD + 2 + d * FIN_N
local n = tonumber(ARGV[at])
for i = 0, n - 1 do
  local b = at + 1 + i * ASK_N
  local uid, jtype, prio = ARGV[b + ASK_UID], ARGV[b + ASK_TYPE], ARGV[b + ASK_PRIORITY]
  local tier_cap, type_cap = optnum(ARGV[b + ASK_TIER_CAP]), optnum(ARGV[b + ASK_TYPE_CAP])
  local cf, ef = ARGV[b + ASK_CONFLICT], ARGV[b + ASK_ESTIMATE_KEY]
  local k = ARGV[b + ASK_FAIRNESS_KEY]
  local key_cap = optnum(ARGV[b + ASK_KEY_CAP])
  if key_cap then capped[k] = true end
  local claim_ttl = optnum(ARGV[b + ASK_CLAIM])
  local rate, burst = optnum(ARGV[b + ASK_RATE]), tonumber(ARGV[b + ASK_BURST])
  local trate, tburst = optnum(ARGV[b + ASK_TYPE_RATE]), tonumber(ARGV[b + ASK_TYPE_BURST])
  local t = nil  -- its tenant (two-level keys), if the ask has a tenant weight
  if ARGV[b + ASK_TENANT_WEIGHT] ~= '' then
    t = ARGV[b + ASK_TENANT]
    if ARGV[b + ASK_TENANT_CAP] ~= '' then tcapped[t] = true end
  end
  local status = V_ADMITTED
  if recovering then
    status = V_RECOVERING
  elseif redis.call('HEXISTS', JOBS, uid) == 1 then
    status = V_RUNNING
  elseif dedupe and redis.call('ZSCORE', DONE, uid) then
    status = V_DONE
  elseif pauses and (redis.call('HEXISTS', POLICIES, 'pk:' .. k) == 1
      or redis.call('HEXISTS', POLICIES, 'pt:' .. jtype) == 1
      or (t and redis.call('HEXISTS', POLICIES, 'pn:' .. t) == 1)) then
    status = V_PAUSED  -- a fleet-wide pause (celery_fair/policies.py), whatever the worker knows
  elseif tier_cap and (tiers[prio] or 0) + claimed('p:' .. prio, uid) >= tier_cap then
    status = V_TIER_CAP
    if claim_ttl then claim('p:' .. prio, uid, claim_ttl) end
  elseif type_cap and (types[jtype] or 0) + claimed('t:' .. jtype, uid) >= type_cap then
    status = V_TYPE_CAP
    if claim_ttl then claim('t:' .. jtype, uid, claim_ttl) end
  elseif key_cap and tonumber(redis.call('HGET', ACTIVE, k) or '0') >= key_cap then
    status = V_KEY_CAP
  elseif t and ARGV[b + ASK_TENANT_CAP] ~= ''
      and tonumber(redis.call('HGET', TEN.ACTIVE, t) or '0') >= tonumber(ARGV[b + ASK_TENANT_CAP]) then
    status = V_TENANT_CAP
  elseif rate and bucket_level(RATES, k, rate, burst, now) < RATE_FULL_START then
    status = V_RATE_LIMIT
  elseif trate and bucket_level(TYPE_RATES, jtype, trate, tburst, now) < RATE_FULL_START then
    status = V_RATE_LIMIT
  elseif (TEN.bucket(t, b, now) or RATE_FULL_START) < RATE_FULL_START then
    status = V_RATE_LIMIT  -- its tenant's bucket, which all the tenant's keys' starts pay
  elseif cf ~= '' and redis.call('HEXISTS', CONFLICTS, cf) == 1 then
    status = V_CONFLICT
  end
  if status == V_ADMITTED then
    local est = ARGV[b + ASK_COST]  -- the cost the job was given, else its learned estimate
    local noted = nil  -- 1 when this admission noted the estimate as used (see finish_jobs)
    if est == '' then
      est = redis.call('HGET', EST, ef)
      if not est then
        est = ARGV[b + ASK_DEFAULT_COST]  -- the type's default cost
      elseif est_ttl then
        est_used(ef, now, snow, est_ttl)
        noted = 1
      end
    end
    local sacc, charge = charge_key(k, t, tonumber(est), tonumber(ARGV[b + ASK_WEIGHT]), advance)
    local tcost = t and TEN.charge(t, tonumber(est), tonumber(ARGV[b + ASK_TENANT_WEIGHT]), advance)
    local tokens, rate_charged = '', nil
    if rate then  -- its bucket pays for the start: 1, or its estimate (core/rates.py)
      rate_charged = 1
      if ARGV[b + ASK_PER_COST] == '1' then rate_charged = tonumber(est) end
      tokens = fmt(bucket_level(RATES, k, rate, burst, now) - rate_charged)
      redis.call('HSET', RATES, k, tokens .. '|' .. snow)
    end
    local ttokens, type_charged = '', nil
    if trate then  -- and its type's, likewise
      type_charged = 1
      if ARGV[b + ASK_TYPE_PER_COST] == '1' then type_charged = tonumber(est) end
      ttokens = fmt(bucket_level(TYPE_RATES, jtype, trate, tburst, now) - type_charged)
      redis.call('HSET', TYPE_RATES, jtype, ttokens .. '|' .. snow)
    end
    local ten = TEN.charge_rate(t, b, tonumber(est), now, snow)  -- {its level after, charged}
    local toh, tok = next_token()
    if claim_ttl then unclaim(uid, prio, jtype) end
    count(prio, jtype, 1)
    if cf ~= '' then redis.call('HSET', CONFLICTS, cf, uid) end
    redis.call('HSET', JOBS, uid, cmsgpack.pack({
      w = worker, toh = toh, tok = tok, t = jtype, p = prio, c = cf, e = ef, k = k,
      est = charge, d = ARGV[b + ASK_DEFAULT_COST], at = snow, u = noted,
      rc = rate_charged, trc = type_charged, tn = t, tst = tcost and tcost[2], ttc = ten[2]}))
    mine = mine + 1
    results[#results + 1] = {V_ADMITTED, toh, tok, est, sacc, tokens, ttokens, tcost and tcost[1] or '',
      ten[1]}
  else
    local tokens, ttokens = '', ''
    if rate then tokens = fmt(bucket_level(RATES, k, rate, burst, now)) end
    if trate then ttokens = fmt(bucket_level(TYPE_RATES, jtype, trate, tburst, now)) end
    results[#results + 1] = {status, 0, 0, '', redis.call('HGET', ACC, k) or '0', tokens, ttokens,
      t and (redis.call('HGET', TEN.ACC, t) or '0') or '', TEN.level(t, b, now)}
  end
end

local held = {}
for i = at + 1 + n * ASK_N, #ARGV do held[#held + 1] = redis.call('HEXISTS', CONFLICTS, ARGV[i]) end
local keys_out = {}
for k in pairs(capped) do
  keys_out[#keys_out + 1] = k
  keys_out[#keys_out + 1] = tonumber(redis.call('HGET', ACTIVE, k) or '0')
end
local tenants_out = {}
for t in pairs(tcapped) do
  tenants_out[#tenants_out + 1] = t
  tenants_out[#tenants_out + 1] = tonumber(redis.call('HGET', TEN.ACTIVE, t) or '0')
end
local tiers_out, types_out = close_store()
return {epoch, snow, finished, results, tiers_out, types_out, held, redis.call('ZCARD', WORKERS),
  keys_out, tenants_out}
