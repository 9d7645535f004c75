-- policies: replace the runtime policies (celery_fair/policies.py) if nobody changed them since
-- the caller read them: a compare-and-set on their version, which works on Redis Cluster too.
-- ARGV: the common head (unused but for its place), the version the caller read, the new
--       document, then the fields of the paused keys, types and tenants ('pk:<key>',
--       'pt:<type>', 'pn:<tenant>'), which admit refuses.
-- Returns {new version} on success, {false} when the version moved (read again and retry).
if (redis.call('HGET', POLICIES, 'version') or '0') ~= ARGV[HEAD + 1] then return {false} end
local old = {}
for _, field in ipairs(redis.call('HKEYS', POLICIES)) do
  local kind = string.sub(field, 1, 3)
  if kind == 'pk:' or kind == 'pt:' or kind == 'pn:' then old[#old + 1] = field end
end
if #old > 0 then redis.call('HDEL', POLICIES, unpack(old)) end
redis.call('HSET', POLICIES, 'doc', ARGV[HEAD + 2])
for i = HEAD + 3, #ARGV do redis.call('HSET', POLICIES, ARGV[i], '1') end
return {redis.call('HINCRBY', POLICIES, 'version', 1)}
