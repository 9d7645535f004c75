-- move: take fair messages out of a queue's lists and into their fairness key's lane or shard,
-- each in its priority step, nothing lost and nothing reordered within a key.
-- Kombu's Redis transport keeps a queue as one list per priority step; a message is a JSON
-- document whose "headers" hold Celery's and ours. Two uses (ARGV[7]):
-- 'queue' (the intake): the source is a queue that producers published fair messages to. A
--   message with a non-empty string fairness_key header moves, unchanged, to the head of its
--   key's lane (core/lanes.py) if it has one, else of its key's shard (celery_fair.routing),
--   behind what waits there.
-- 'shard' (the reroute): the source is a shard. A message of a key with a lane (a straggler:
--   it waited in the shard from before its key got the lane) moves to the *tail* of its lane,
--   the consuming end, oldest nearest, so it pops before the key's newer messages there;
--   unless the lane's next message is itself a straggler moved from this shard (its routing
--   key is the shard's): then older stragglers still wait there, and these go to the head,
--   behind everything, so that stragglers keep their order among themselves (producers that
--   route by hash alone, of an older release, keep publishing the key to its shard).
-- Every other message (no key, no lane in 'shard', not readable as JSON) stays, in its order.
-- KEYS: the source's lists, one per step, highest priority first (S of them, with Kombu's key
--       prefix); then the shards' lists: shard i, step s at S + i * S + s (i from 0); then
--       the lanes' lists: lane j, step s at S + N * S + j * S + s (j from 0).
-- ARGV[1]: the shard hash's name, which must be 'sha1-32' (routing.SHARD_HASH)
-- ARGV[2]: N, the number of shards in KEYS (0 for 'shard'); ARGV[3]: S, the number of steps
-- ARGV[4]: the most messages to look at in this call (over all steps)
-- ARGV[5]: L, the number of lanes in KEYS; ARGV[6]: T, the lane threshold (0: none)
-- ARGV[7]: 'queue' or 'shard'; ARGV[8]: ('shard') the shard's name, its messages' routing key
-- ARGV[9]: m, the number of keys with a lane; then m pairs: a key, its lane (below L)
-- ('queue' only) A key without a lane that has more than T messages among those looked at in
-- one step is heavy: the call then moves nothing and returns such keys, to be given lanes
-- before the next call, so that no burst lands in a light key's shard.
-- Returns {moved, looked at, {heavy keys...}, {key, count, ...}}: the last, each key without a
-- lane moved to its shard and how many (the caller counts them per second, as a producer
-- does). A message is moved at most once per call, and
-- nothing is ever lost: a message is pushed back or moved in the same call that popped it,
-- and the JSON is only read (a document cjson cannot read stays where it was).
-- Cost: O(looked at); about 1 us per message to look (a plain string search) and 15 us more
-- to move one (cjson.decode and SHA-1).
if ARGV[1] ~= 'sha1-32' then
  return redis.error_reply('celery-fair intake: unknown shard hash ' .. ARGV[1])
end
local n, steps, budget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local lanes, threshold = tonumber(ARGV[5]), tonumber(ARGV[6])
local mode, source, m = ARGV[7], ARGV[8], tonumber(ARGV[9])
if mode ~= 'queue' and mode ~= 'shard' then
  return redis.error_reply('celery-fair intake: unknown source ' .. tostring(mode))
end
local reroute = mode == 'shard'
if reroute then threshold = 0 end
local lane_of = {}
for i = 0, m - 1 do lane_of[ARGV[10 + 2 * i]] = tonumber(ARGV[11 + 2 * i]) end
local marker = '"fairness_key": "'

local function key_of(raw)
  -- A cheap test first: most messages that stay carry no fairness_key header at all.
  local at = string.find(raw, marker, 1, true)
  if not at or string.sub(raw, at + #marker, at + #marker) == '"' then return nil end
  local ok, doc = pcall(cjson.decode, raw)
  if not ok or type(doc) ~= 'table' or type(doc.headers) ~= 'table' then return nil end
  local key = doc.headers.fairness_key
  if type(key) == 'string' and key ~= '' then return key end
  return nil
end

-- ('shard') Whether what moves to the lane list ``list`` goes to its tail: no straggler moved
-- from this shard waits there next. Asked before anything is pushed to it in this call.
local tail_of = {}
local function to_tail(list)
  local v = tail_of[list]
  if v == nil then
    v = true
    local raw = redis.call('LINDEX', list, -1)
    if raw then
      local ok, doc = pcall(cjson.decode, raw)
      if ok and type(doc) == 'table' and type(doc.properties) == 'table' then
        local info = doc.properties.delivery_info
        v = not (type(info) == 'table' and info.routing_key == source)
      end
    end
    tail_of[list] = v
  end
  return v
end

local moved, looked = 0, 0
local to_shards, order = {}, {}  -- key without a lane -> how many moved to its shard
for s = 1, steps do
  if looked >= budget then break end
  local list = KEYS[s]
  -- The oldest messages are at the tail (Kombu pushes at the head and pops from the tail).
  local tail = redis.call('LRANGE', list, -(budget - looked), -1)
  local count = #tail
  if count > 0 then
    local keys, any = {}, false
    for j = count, 1, -1 do  -- oldest first
      local k = key_of(tail[j])
      if reroute and k and not lane_of[k] then k = nil end
      keys[j] = k or false
      if k then any = true end
    end
    looked = looked + count
    if any and threshold > 0 then
      local counts, heavy = {}, {}
      for j = 1, count do
        local k = keys[j]
        if k and not lane_of[k] then
          counts[k] = (counts[k] or 0) + 1
          if counts[k] == threshold + 1 then heavy[#heavy + 1] = k end
        end
      end
      if #heavy > 0 then return {moved, looked, heavy, {}} end
    end
    if any and reroute then
      for _ = 1, count do redis.call('RPOP', list) end
      -- To a lane's tail newest first (the oldest ends nearest it, and pops first); to its
      -- head oldest first (the newest ends farthest from the tail).
      for j = 1, count do
        if keys[j] then
          local lane = KEYS[steps + n * steps + lane_of[keys[j]] * steps + s]
          if to_tail(lane) then
            redis.call('RPUSH', lane, tail[j])
            moved = moved + 1
          end
        end
      end
      for j = count, 1, -1 do
        if keys[j] then
          local lane = KEYS[steps + n * steps + lane_of[keys[j]] * steps + s]
          if not to_tail(lane) then
            redis.call('LPUSH', lane, tail[j])
            moved = moved + 1
          end
        end
      end
      for j = 1, count do
        if not keys[j] then redis.call('RPUSH', list, tail[j]) end
      end
    elseif any then
      for _ = 1, count do redis.call('RPOP', list) end
      for j = count, 1, -1 do
        if keys[j] then
          local lane = lane_of[keys[j]]
          local at
          if lane then
            at = steps + n * steps + lane * steps + s
          else
            at = steps + tonumber(string.sub(redis.sha1hex(keys[j]), 1, 8), 16) % n * steps + s
            if not to_shards[keys[j]] then order[#order + 1] = keys[j] end
            to_shards[keys[j]] = (to_shards[keys[j]] or 0) + 1
          end
          redis.call('LPUSH', KEYS[at], tail[j])
          moved = moved + 1
        end
      end
      -- What stays goes back to the tail in its order: the oldest last, so it pops first.
      for j = 1, count do
        if not keys[j] then redis.call('RPUSH', list, tail[j]) end
      end
    end
  end
end
local counted = {}
for _, k in ipairs(order) do
  counted[#counted + 1] = k
  counted[#counted + 1] = to_shards[k]
end
return {moved, looked, {}, counted}
