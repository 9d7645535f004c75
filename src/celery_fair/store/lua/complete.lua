-- complete: finish or release a batch of running jobs, each fenced by its token.
-- ARGV: the common head (see common.lua), alpha, n, then n times:
--       uid, token, elapsed ('' = release without learning).
-- A job whose record is gone or carries another token is stale: nothing changes for it.
-- Otherwise its tier, type and conflict are released and, with an elapsed time, its estimate
-- becomes alpha * elapsed + (1 - alpha) * previous.
-- Returns {epoch, now, {status, estimate} per job, tiers, types}; status is ok or stale.
local now = now_s()
local epoch = open_store(ARGV[1], ARGV[2], now, tonumber(ARGV[5]))
local alpha = tonumber(ARGV[10])
local est_ttl = optnum(ARGV[7])
maintain(now, optnum(ARGV[6]), est_ttl, optnum(ARGV[8]))
local results = {}
local n = tonumber(ARGV[11])
for i = 0, n - 1 do
  local b = 12 + i * 3
  local uid, token, elapsed = ARGV[b], tonumber(ARGV[b + 1]), optnum(ARGV[b + 2])
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
    results[#results + 1] = {'ok', fmt(value)}
  end
end
local tiers, types = counts()
return {epoch, fmt(now), results, tiers, types}
