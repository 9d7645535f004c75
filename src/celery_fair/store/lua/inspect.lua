-- inspect: what the store holds now, for people (``celery-fair store``). Reads only: it neither
-- creates the store nor renews a lease, so looking changes nothing.
-- ARGV: the common head (see common.lua; only the worker field is read, as for every script).
-- Returns one JSON document (tokens as "high:low": wire.py): {now, schema, epoch, token,
-- recovering_until, workers
-- [{worker, lease_until, jobs}], tiers, types, jobs [{uid, worker, token, type, priority,
-- conflict, fairness_key, estimate, since, tenant (two-level keys)}], conflicts {field: uid},
-- costs {key: accumulated} for the keys with a running job, tenants {tenant: {running, cost}}
-- for the tenants with one (two-level keys), keys (accumulated costs kept), estimates
-- (estimates kept), tombstones}.
-- Cost: O(running jobs + live workers + conflicts held).
local now = now_s()
local meta = redis.call('HMGET', META, 'schema', 'epoch', 'token', 'recovering_until', 'token_high')
local out = {
  now = now, schema = meta[1] or cjson.null, epoch = meta[2] or cjson.null,
  token = token_text(tonumber(meta[5] or '0'), tonumber(meta[3] or '0')), recovering_until = tonumber(meta[4] or '') or cjson.null,
  tiers = totable(redis.call('HGETALL', TIERS)), types = totable(redis.call('HGETALL', TYPES)),
  keys = redis.call('HLEN', ACC), estimates = redis.call('HLEN', EST),
  tombstones = redis.call('ZCARD', DONE),
}
local workers = redis.call('ZRANGE', WORKERS, 0, -1, 'WITHSCORES')
local live = {}
for i = 1, #workers, 2 do
  local w = workers[i]
  live[#live + 1] = {worker = w, lease_until = tonumber(workers[i + 1]),
    jobs = tonumber(redis.call('HGET', META, mine_field(w)) or '0')}
end
local jobs, costs, tenants = {}, {}, {}
local all = redis.call('HGETALL', JOBS)
for i = 1, #all, 2 do
  local rec = cmsgpack.unpack(all[i + 1])
  jobs[#jobs + 1] = {uid = all[i], worker = rec.w, token = token_text(rec.toh, rec.tok), type = rec.t,
    priority = tonumber(rec.p), conflict = rec.c, fairness_key = rec.k,
    estimate = tonumber(rec.est), since = tonumber(rec.at), tenant = rec.tn}
  if costs[rec.k] == nil then costs[rec.k] = tonumber(redis.call('HGET', ACC, rec.k) or '0') end
  if rec.tn and tenants[rec.tn] == nil then
    tenants[rec.tn] = {running = tonumber(redis.call('HGET', TEN.ACTIVE, rec.tn) or '0'),
      cost = tonumber(redis.call('HGET', TEN.ACC, rec.tn) or '0')}
  end
end
out.tenants = tenants
local held = redis.call('HGETALL', CONFLICTS)
local conflicts = {}
for i = 1, #held, 2 do conflicts[held[i]] = held[i + 1] end
out.workers, out.jobs, out.conflicts, out.costs = live, jobs, conflicts, costs  -- {} when empty
return cjson.encode(out)
