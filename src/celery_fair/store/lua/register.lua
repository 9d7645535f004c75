-- register: put back jobs this worker is running that the store no longer knows (after a
-- Redis restart without persistence, or after its lease expired during a long pause). The
-- jobs do run, so they count again even if that briefly puts a cap over its limit; a
-- conflict is taken back only if nobody else holds it. Jobs already known are left alone.
-- ARGV: the common head (see common.lua), n, then n times:
--       uid, token, type, priority, conflict field, estimate field, fairness key, estimate,
--       default cost.
-- Returns {epoch, registered}.
-- Cost: O(n).
local now = now_s()
local epoch = open_store(ARGV[1], ARGV[2], now, tonumber(ARGV[5]))
local worker = ARGV[3]
renew(now, tonumber(ARGV[4]), true)
local registered = 0
local n = tonumber(ARGV[HEAD + 1])
for i = 0, n - 1 do
  local b = HEAD + 2 + i * 9
  local uid, tok = ARGV[b], tonumber(ARGV[b + 1])
  if redis.call('HEXISTS', JOBS, uid) == 0 then
    local jtype, prio, cf, ef, k = ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6]
    count(prio, jtype, 1)
    if cf ~= '' then
      if redis.call('HEXISTS', CONFLICTS, cf) == 0 then
        redis.call('HSET', CONFLICTS, cf, uid)
      else
        cf = ''  -- someone else holds it: this job must not release it
      end
    end
    key_active(k)
    if token < tok then token = tok end
    redis.call('HSET', JOBS, uid, cmsgpack.pack({
      w = worker, tok = tok, t = jtype, p = prio, c = cf, e = ef, k = k,
      est = ARGV[b + 7], d = ARGV[b + 8], at = fmt(now)}))
    mine = mine + 1
    registered = registered + 1
  end
end
close_store()
return {epoch, registered}
