-- open: check the store's schema before a worker consumes anything (RedisStore.check). A store
-- of an older schema that no live worker of it holds is upgraded in place, an empty one is
-- created, and one that cannot be opened fails loudly (open_store in common.lua: the same
-- rule every other script applies on its first touch).
-- ARGV: the common head (see common.lua).
-- Returns the store's epoch.
-- Cost: O(tiers + types + claims), as any script's opening.
local now = now_s()
local epoch = open_store(ARGV[H_SCHEMA], ARGV[H_EPOCH], now, tonumber(ARGV[H_RECOVERY]))
close_store()
return epoch
