-- complete: finish or release a batch of running jobs, each fenced by its token.
-- ARGV: the common head (see common.lua), n, then n times:
--       uid, token ("high:low"), elapsed ('' = release without learning), how ('1': its message was
--       acknowledged, so keep a tombstone for the dedupe window; 'u': it never started, so
--       refund the cost its key was charged; '0' otherwise).
-- A job whose record is gone or carries another token is stale: nothing changes for it.
-- Otherwise its tier, type and conflict are released and, with an elapsed time, its estimate
-- becomes alpha * elapsed + (1 - alpha) * previous.
-- Returns {epoch, now, {status, estimate} per job, tiers, types}; status is F_APPLIED ('ok')
-- or F_STALE ('stale'), generated from store/wire.py.
-- Cost: O(n), plus housekeeping as in admit.lua.
local now = now_s()
local snow = fmt(now)
local epoch = open_store(ARGV[H_SCHEMA], ARGV[H_EPOCH], now, tonumber(ARGV[H_RECOVERY]))
maintain(now, optnum(ARGV[H_COST_TTL]), optnum(ARGV[H_ESTIMATE_TTL]), optnum(ARGV[H_RESET_INTERVAL]), 64, MAINTAIN_EVERY)
local results = finish_jobs(HEAD + 2, tonumber(ARGV[HEAD + 1]), now, snow)
local tiers_out, types_out = close_store()
return {epoch, snow, results, tiers_out, types_out}
