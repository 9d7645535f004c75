-- heartbeat: renew this worker's lease, reclaim dead workers' jobs, and read the state the
-- worker needs to order its held jobs. One round trip per worker per period, not per job.
-- ARGV: the common head (see common.lua), the runtime policies' version the worker has, the
--       number c of conflict fields, c conflict fields, the number k of fairness keys, k
--       fairness keys, then tenants (two-level keys).
-- Returns {epoch, now, mine (this worker's running jobs in the store), reclaimed,
--          tiers, types, {1/0 held per conflict field}, {accumulated cost per key},
--          live workers, {running jobs per key}, the policies' version, and their document
--          when that version is not the worker's ('' otherwise), {accumulated cost per
--          tenant}, {running jobs per tenant}}.
-- Cost: O(conflicts + keys + tenants + housekeeping bounded at 2,048 per kind), plus
-- O(running jobs) when up to 64 workers died.
local now = now_s()
local epoch = open_store(ARGV[H_SCHEMA], ARGV[H_EPOCH], now, tonumber(ARGV[H_RECOVERY]))
local worker = ARGV[H_WORKER]
renew(now, tonumber(ARGV[H_LEASE]), true)
local reclaimed = reclaim(now, 64)
maintain(now, optnum(ARGV[H_COST_TTL]), optnum(ARGV[H_ESTIMATE_TTL]), optnum(ARGV[H_RESET_INTERVAL]), 2048)
local known = ARGV[HEAD + 1]
local c = tonumber(ARGV[HEAD + 2])
local held, accs, runs = {}, {}, {}
for i = 1, c do held[i] = redis.call('HEXISTS', CONFLICTS, ARGV[HEAD + 2 + i]) end
local kb = HEAD + 3 + c
local nk = tonumber(ARGV[kb])
for i = kb + 1, kb + nk do
  accs[#accs + 1] = redis.call('HGET', ACC, ARGV[i]) or '0'
  runs[#runs + 1] = tonumber(redis.call('HGET', ACTIVE, ARGV[i]) or '0')
end
local taccs, truns = {}, {}
for i = kb + nk + 1, #ARGV do
  taccs[#taccs + 1] = redis.call('HGET', TEN.ACC, ARGV[i]) or '0'
  truns[#truns + 1] = tonumber(redis.call('HGET', TEN.ACTIVE, ARGV[i]) or '0')
end
local version = redis.call('HGET', POLICIES, 'version') or '0'
local doc = ''
if version ~= known then doc = redis.call('HGET', POLICIES, 'doc') or '' end
local tiers_out, types_out = close_store()
return {epoch, fmt(now), mine, reclaimed, tiers_out, types_out, held, accs,
  redis.call('ZCARD', WORKERS), runs, version, doc, taccs, truns}
