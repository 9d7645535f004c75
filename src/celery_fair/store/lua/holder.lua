-- celery-fair: who holds a conflict (job control's explain). Reads only.
--
-- KEYS: 1 conflicts, 2 jobs (the store's own, as in common.lua)
-- ARGV[1]: the conflict field
-- -> {} when nobody holds it, else {uid, its worker ('' if its record is gone),
--    seconds since its admission ('' if unknown)}, numbers as strings

local uid = redis.call('HGET', KEYS[1], ARGV[1])
if not uid then return {} end
local raw = redis.call('HGET', KEYS[2], uid)
if not raw then return {uid, '', ''} end
local job = cmsgpack.unpack(raw)
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local since = tonumber(job.at or '')
return {uid, job.w or '', since and string.format('%.6f', now - since) or ''}
