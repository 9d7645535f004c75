-- lanes: the fleet's lane table (docs/design.md 5f): which heavy fairness key has which lane.
-- The rule is core/lanes.py's (LaneTable, agreed_size), stated again here; store/base.py
-- (Store.lanes ... Store.sweep_lanes) says what each operation does, MemoryStore runs
-- LaneTable itself, and tests/store/test_lanes_agree.py checks that the two answer alike.
-- It touches only LANES (KEYS[16], described in common.lua) and reads META (schema, epoch)
-- and WORKERS (leases). It never creates the store nor renews a lease: producers call it, and
-- a producer's call must not open, on a store that came back empty, a new epoch without the
-- recovery window a worker's call would open (common.lua, open_store).
-- A key's field is 'k:' and the key itself, whatever characters it holds: the rest of the
-- field after the prefix is the key, so no length is needed to read it back.
-- ARGV: the common head (its worker: the caller of a sweep), the operation, then its own:
--   OP_READ   the version the caller has
--   OP_ASK    the fairness key that turned heavy
--   OP_RENEW  the fairness keys still heavy (to the end)
--   OP_SWEEP  SWEEP_SIZE (the lanes the caller consumes), SWEEP_LEASE (an assignment's lease,
--             seconds), SWEEP_LOOKED (n), then n lanes looked at, then those found empty
-- Returns {epoch ('' if no worker has opened the store), ...}:
--   OP_READ   then the version, then false if it is the caller's, else {key, lane, ...} for
--             every key on its lane (leaving ones are not) and the agreed size
--   OP_ASK    then the key's lane, or false while the fleet agrees on no lanes
--   OP_RENEW, OP_SWEEP  nothing more
-- Cost: OP_READ O(1) while unchanged, else O(fields: assignments + lanes + announcements);
-- OP_ASK O(1) for a key with a lane, O(agreed size) for a new one; OP_RENEW O(keys given);
-- OP_SWEEP O(fields + live workers).
local now = now_s()
local meta = redis.call('HMGET', META, 'schema', 'epoch')
if meta[1] and meta[1] ~= ARGV[H_SCHEMA] then
  error({err = 'celery-fair: the store at ' .. META .. ' has schema ' .. meta[1] ..
    '; this celery-fair speaks schema ' .. ARGV[H_SCHEMA] .. ': no lanes until a worker of ' ..
    'the same version as this one has opened it.'})
end
local epoch = meta[2] or ''
-- A new table's version: its creation time (store/wire.py, first_lane_version).
redis.call('HSETNX', LANES, 'version',
  string.format('%.0f', math.floor(now * LANE_VERSION_TICKS_PER_S)))

-- A key's assignment from its field's value: {lane, renewed, leaving (nil while on its lane)}.
local function assignment(value)
  local lane, renewed, leaving = string.match(value, '^(%d+)|([^|]*)|([^|]*)$')
  return {lane = tonumber(lane), renewed = tonumber(renewed), leaving = tonumber(leaving)}
end

local function save(k, a)
  local leaving = ''
  if a.leaving then leaving = fmt(a.leaving) end
  redis.call('HSET', LANES, 'k:' .. k, a.lane .. '|' .. fmt(a.renewed) .. '|' .. leaving)
end

-- What producers route by changed.
local function bump() redis.call('HINCRBY', LANES, 'version', 1) end

-- Forget key ``k``'s assignment to ``lane`` (given back: its lane may go to another key).
local function drop(k, lane)
  redis.call('HDEL', LANES, 'k:' .. k)
  if redis.call('HINCRBY', LANES, 'n:' .. lane, -1) <= 0 then redis.call('HDEL', LANES, 'n:' .. lane) end
end

-- How many keys each of lanes 0 .. size - 1 has, as {[lane] = n}: HMGET, a few hundred
-- fields at a time (unpack's limit).
local function owners(size)
  local fields = {}
  for j = 0, size - 1 do fields[#fields + 1] = 'n:' .. j end
  local out = {}
  for first = 1, #fields, 256 do
    local part = redis.call('HMGET', LANES, unpack(fields, first, math.min(first + 255, #fields)))
    for i = 1, #part do out[first + i - 2] = tonumber(part[i] or '0') end
  end
  return out
end

-- LaneTable.ask: the key's lane, renewed (a leaving key gets it back while the fleet still
-- agrees on it), else the lane with the fewest keys, lowest first; false with no lanes.
local function ask(k)
  local found = redis.call('HMGET', LANES, 'size', 'k:' .. k)
  local size = tonumber(found[1] or '0')
  if found[2] then
    local a = assignment(found[2])
    if a.lane < size then
      local back = a.leaving ~= nil
      a.renewed, a.leaving = now, nil
      save(k, a)
      if back then bump() end
      return a.lane
    end
    drop(k, a.lane)  -- leaving a lane beyond those agreed now: it gets a new one
  end
  if size < 1 then return false end
  local counts, lane = owners(size), 0
  for j = 1, size - 1 do
    if counts[j] < counts[lane] then lane = j end
  end
  save(k, {lane = lane, renewed = now})
  redis.call('HINCRBY', LANES, 'n:' .. lane, 1)
  bump()
  return lane
end

-- LaneTable.renew: each key on its lane has its lease run from now.
local function renew(first)
  for i = first, #ARGV do
    local value = redis.call('HGET', LANES, 'k:' .. ARGV[i])
    if value then
      local a = assignment(value)
      if not a.leaving then
        a.renewed = now
        save(ARGV[i], a)
      end
    end
  end
end

-- core/lanes.py agreed_size over fleet_sizes: the fewest lanes any live worker announced, and
-- none once one has been live without announcing for LANE_ANNOUNCE_GRACE seconds (its 'u:'
-- field keeps since when; a field of a worker that announced or is no longer live goes).
local function agreed_size(live, announced, silent)
  local agreed, none = nil, false
  for w in pairs(live) do
    local n = announced[w]
    if n ~= nil then
      if agreed == nil or n < agreed then agreed = n end
    else
      local since = silent[w]
      if since == nil then
        since = now
        redis.call('HSET', LANES, 'u:' .. w, fmt(now))
      end
      if now - since >= LANE_ANNOUNCE_GRACE then none = true end
    end
  end
  for w in pairs(silent) do
    if not live[w] or announced[w] ~= nil then redis.call('HDEL', LANES, 'u:' .. w) end
  end
  if none then return 0 end
  return agreed or 0
end

-- Store.sweep_lanes: the caller's announcement, the agreed size over the live workers
-- (LaneTable.resize), then LaneTable.sweep.
local function sweep(b)
  local worker, lease = ARGV[H_WORKER], tonumber(ARGV[b + SWEEP_LEASE])
  local n = tonumber(ARGV[b + SWEEP_LOOKED])
  redis.call('HSET', LANES, 'w:' .. worker, ARGV[b + SWEEP_SIZE])
  local live = {[worker] = true}
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', WORKERS, fmt(now), '+inf')) do live[w] = true end
  local keys, streaks, announced, silent, size = {}, {}, {}, {}, 0
  local flat = redis.call('HGETALL', LANES)
  for i = 1, #flat, 2 do
    local field, value = flat[i], flat[i + 1]
    local kind, name = string.sub(field, 1, 2), string.sub(field, 3)
    if kind == 'k:' then
      keys[name] = assignment(value)
    elseif kind == 'e:' then
      streaks[tonumber(name)] = tonumber(value)
    elseif kind == 'w:' then
      if live[name] then announced[name] = tonumber(value) else redis.call('HDEL', LANES, field) end
    elseif kind == 'u:' then
      silent[name] = tonumber(value)
    elseif field == 'size' then
      size = tonumber(value)
    end
  end
  local dirty = {}  -- keys whose assignment changed, to write back once
  -- LaneTable.resize: keys on lanes beyond the agreed size leave them at once
  local agreed = agreed_size(live, announced, silent)
  if agreed ~= size then
    redis.call('HSET', LANES, 'size', agreed)
    for k, a in pairs(keys) do
      if a.lane >= agreed and not a.leaving then
        a.leaving, dirty[k] = now, true
      end
    end
    bump()  -- the map carries the agreed size
  end
  -- LaneTable.sweep: each lane looked at is found empty once more in a row, or not
  local empty = {}
  for i = b + SWEEP_N + n, #ARGV do empty[tonumber(ARGV[i])] = true end
  for i = b + SWEEP_N, b + SWEEP_N + n - 1 do
    local lane = tonumber(ARGV[i])
    if empty[lane] then
      streaks[lane] = (streaks[lane] or 0) + 1
      redis.call('HSET', LANES, 'e:' .. lane, streaks[lane])
    else
      streaks[lane] = nil
      redis.call('HDEL', LANES, 'e:' .. lane)
    end
  end
  -- then keys past their grace give their lane back, and keys whose lease lapsed leave a lane
  -- found empty LANE_EMPTY_SWEEPS times in a row
  local left = false
  for k, a in pairs(keys) do
    if a.leaving then
      if now - a.leaving >= LANE_GRACE then
        drop(k, a.lane)
        dirty[k] = nil
      end
    elseif now - a.renewed >= lease and (streaks[a.lane] or 0) >= LANE_EMPTY_SWEEPS then
      a.leaving, dirty[k], left = now, true, true
    end
  end
  for k in pairs(dirty) do save(k, keys[k]) end
  if left then bump() end
end

local op = ARGV[HEAD + 1]
if op == OP_READ then
  local version = redis.call('HGET', LANES, 'version')
  if version == ARGV[HEAD + 2] then return {epoch, version, false} end
  local routed = {}
  local flat = redis.call('HGETALL', LANES)
  for i = 1, #flat, 2 do
    if string.sub(flat[i], 1, 2) == 'k:' then
      local a = assignment(flat[i + 1])
      if not a.leaving then
        routed[#routed + 1] = string.sub(flat[i], 3)
        routed[#routed + 1] = a.lane
      end
    end
  end
  return {epoch, version, routed, tonumber(redis.call('HGET', LANES, 'size') or '0')}
elseif op == OP_ASK then
  return {epoch, ask(ARGV[HEAD + 2])}
elseif op == OP_RENEW then
  renew(HEAD + 2)
  return {epoch}
elseif op == OP_SWEEP then
  sweep(HEAD + 2)
  return {epoch}
end
error('celery-fair lanes.lua: unknown operation ' .. tostring(op))
