-- celery-fair: helpers shared by every script (prepended to each one when it is loaded).
--
-- KEYS, the same fixed list for every script, all under one hash tag so one slot holds them:
--   1 meta      hash  schema, epoch, token_high and token (the last fencing token's halves:
--                     celery_fair/store/wire.py, TOKEN_LOW_BITS), reset_at, recovering_until,
--                     maint_at (when admit and complete next do housekeeping),
--                     n:<worker> (that worker's running jobs) and r:<worker> (when admit next
--                     renews that worker's lease)
--   2 tiers     hash  priority -> running jobs of that tier, fleet-wide
--   3 types     hash  job type -> running jobs of that type
--   4 conflicts hash  conflict field -> uid of the job that holds it
--   5 jobs      hash  uid -> cmsgpack record {w, toh, tok, t, p, c, e, k, est, d, at, u, rc, trc,
--                     tn, tst, ttc}; toh and tok are its token's high and low halves; c is the
--                     conflict field the job holds ('' when it holds none); est is what its
--                     key was charged (its estimate / the key's weight); u is 1 when its
--                     admission noted its estimate as used; rc, trc and ttc what its key's,
--                     type's and tenant's buckets were charged (absent: no rate); tn its
--                     tenant (two-level keys) and tst what the tenant was charged
--   6 workers   zset  worker -> lease expiry (Redis server time, seconds)
--   7 acc       hash  fairness key -> accumulated cost
--   8 seen      zset  idle fairness key -> when it became idle (for the TTL)
--   9 active    hash  fairness key -> its running jobs (keys with at least one)
--  10 est       hash  estimate field -> learned estimate
--  11 estseen   zset  estimate field -> when it was last used or updated
--  12 minacc    zset  active fairness key -> accumulated cost (for advance_idle)
--  13 done      zset  uid of a job that finished for good -> when (a tombstone, for dedupe)
--  14 policies  hash  version -> n, doc -> the runtime policies (JSON; celery_fair/policies.py)
--  15 claims    hash  'p:<priority>' or 't:<type>' -> cmsgpack {u = uid, x = expiry}: the next
--                     slot of that tier or type cap to free is held for the urgent job uid
--                     (admit.lua); other jobs count it as taken until it starts or x passes
--  16 lanes     hash  the fleet's lane table (lanes.lua, which alone touches it): 'k:<fairness
--                     key>' -> '<lane>|<renewed>|<leaving since>' ('' while the key is on its
--                     lane), 'n:<lane>' -> its keys (leaving ones included), 'e:<lane>' ->
--                     sweeps in a row that found it empty, 'w:<worker>' -> the lanes that
--                     worker consumes, 'size' -> the lanes the fleet agrees on, 'version'
--  17 rates     hash  fairness key -> '<level>|<when>': its rate's bucket (core/rates.py;
--                     absent: full), charged by admit, forgotten with the key's cost (TTL)
--  18 type_rates hash job type -> '<level>|<when>': the type's rate's bucket, as a key's
--                     (never forgotten: types are few)
--  19 tacc      hash  tenant -> accumulated cost (two-level keys: core/tenants.py)
--  20 tseen     zset  idle tenant -> when it became idle (for the TTL)
--  21 tactive   hash  tenant -> its keys' running jobs (tenants with at least one)
--  22 tminacc   zset  active tenant -> accumulated cost (for advance_idle)
--  23 tkmin     zset  for advance_idle with two-level keys, each running key's cost among its
--                     tenant's keys: members TEN.member(tenant, key, cost), all at score 0,
--                     so that one tenant's members sort by cost (see TEN.member)
--  24 trates    hash  tenant -> '<level>|<when>': its rate's bucket, as a key's, forgotten with
--                     the tenant's cost (TTL)
-- ARGV of every script starts with the same head, then its own lists: their positions and
-- strides are locals generated from celery_fair/store/wire.py (HEAD, H_WORKER, ASK_N, ...).
-- Numbers cross the script boundary as strings in %.17g, which round-trips a double exactly,
-- so the estimate rule computes bit for bit what the Python core computes.

local META, TIERS, TYPES, CONFLICTS, JOBS, WORKERS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local ACC, SEEN, ACTIVE, EST, ESTSEEN, MINACC = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local DONE, POLICIES, CLAIMS, LANES, RATES = KEYS[13], KEYS[14], KEYS[15], KEYS[16], KEYS[17]
local TYPE_RATES = KEYS[18]
-- Two-level keys (keys 19 to 24, and their helpers below): one table, as a script may not
-- have more than 200 locals.
local TEN = {ACC = KEYS[19], SEEN = KEYS[20], ACTIVE = KEYS[21], MINACC = KEYS[22], KMIN = KEYS[23],
  RATES = KEYS[24]}
-- Seconds between two housekeeping passes by admit and complete (heartbeats always make one).
local MAINTAIN_EVERY = 0.05

local function fmt(x) return string.format('%.17g', x) end

local function now_s()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function optnum(s) if s == '' then return nil end return tonumber(s) end

-- Script-wide state, read once per call by open_store and written back once by close_store:
-- the fleet's running counts by tier and by type, the last fencing token, the caller's own
-- running jobs, and when the throttled housekeeping is next due. Changing them in between is
-- free.
local tiers, types, changed_tiers, changed_types = {}, {}, {}, {}
-- The last fencing token, as its halves (wire.py): token_high * TOKEN_LOW + token.
local token, token_read, token_high, token_high_read, maint_at = 0, 0, 0, 0, 0
local mine, mine_read = 0, 0
local renew_at = 0
local meta_changes = {}  -- meta fields to write back, as {field, value, ...}
local released = 0  -- running jobs this call released (drop_job), announced by close_store
-- Urgent jobs' claims on tier and type caps, field -> {u = uid, x = expiry}, read once per
-- call by open_store (expired ones dropped), and the time of the call.
local claims, call_now = {}, 0

-- The meta field counting worker ``w``'s running jobs.
local function mine_field(w) return 'n:' .. w end
local MINE = mine_field(ARGV[H_WORKER])
-- The meta field saying when admit next renews worker ``w``'s lease.
local function renew_field(w) return 'r:' .. w end

local function totable(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = tonumber(flat[i + 1]) end
  return t
end

-- A token "high:low" as its two halves (nil for '').
local function parse_token(s)
  local high, low = string.match(s, '^(%d+):(%d+)$')
  if not high then return nil end
  return tonumber(high), tonumber(low)
end

-- The last token becomes (high, low) if that is later: tokens continue above it.
local function raise_token(high, low)
  if high > token_high or (high == token_high and low > token) then
    token_high, token = high, low
  end
end

-- A token's halves as text, for JSON (whose numbers would round the whole token).
local function token_text(high, low) return string.format('%.0f:%.0f', high, low) end

-- Check the schema and create the meta record when the store is empty. ``expected`` is the
-- epoch the caller last saw ('' for none). A store that has gone (a Redis restart without
-- persistence) while a caller remembers it opens a recovery window of ``window`` seconds in
-- which nothing is admitted, so every worker can register its running jobs first. A new store's
-- tokens start above its creation time in milliseconds (wire.py, TOKEN_LOW_BITS); every call
-- raises them above the highest token its caller has seen (H_TOKEN_SEEN), so they never go back.
--
-- A store of an older schema is upgraded in place once no worker of it holds a live lease (they
-- have all stopped, or died and lapsed): its running state goes (no live worker owns any of
-- it: it is what a reclaim would free) and what it learned stays (accumulated costs,
-- estimates, tombstones, runtime policies); then it opens as a new store. While a worker of the
-- old schema lives, or when the store is newer than the caller, the call fails loudly.
local function upgrade_or_refuse(found, schema, now)
  local old, new = tonumber(found), tonumber(schema)
  local live = redis.call('ZCOUNT', WORKERS, '(' .. fmt(now), '+inf')
  if old and new and old < new and live == 0 then
    -- a key that ran goes idle now, so that its accumulated cost lapses after the TTL as usual
    for _, k in ipairs(redis.call('HKEYS', ACTIVE)) do redis.call('ZADD', SEEN, now, k) end
    for _, t in ipairs(redis.call('HKEYS', TEN.ACTIVE)) do redis.call('ZADD', TEN.SEEN, now, t) end
    redis.call('DEL', META, TIERS, TYPES, CONFLICTS, JOBS, WORKERS, ACTIVE, MINACC, CLAIMS,
      TEN.ACTIVE, TEN.MINACC, TEN.KMIN)
    return
  end
  local why
  if old and new and old < new then
    why = live .. ' worker(s) of schema ' .. found .. ' hold a live lease: stop them, and the ' ..
      'first call of this version once their leases have lapsed upgrades the store in place'
  else
    why = 'upgrade this worker, or use another fair_store_prefix'
  end
  error({err = 'celery-fair: the store at ' .. META .. ' has schema ' .. found ..
    '; this celery-fair speaks schema ' .. schema .. ': ' .. why .. '.'})
end

local function open_store(schema, expected, now, window)
  local m = redis.call('HMGET', META, 'schema', 'epoch', 'recovering_until', 'token', 'maint_at', MINE,
    renew_field(ARGV[H_WORKER]), 'token_high')
  if m[1] and m[1] ~= schema then
    upgrade_or_refuse(m[1], schema, now)
    m = {false}
  end
  tiers, types = totable(redis.call('HGETALL', TIERS)), totable(redis.call('HGETALL', TYPES))
  call_now = now
  local flat = redis.call('HGETALL', CLAIMS)
  for i = 1, #flat, 2 do
    local c = cmsgpack.unpack(flat[i + 1])
    if c.x > now then claims[flat[i]] = c else redis.call('HDEL', CLAIMS, flat[i]) end
  end
  local seen_high, seen_low = parse_token(ARGV[H_TOKEN_SEEN])
  if m[1] == false then
    local epoch = fmt(now) .. ':' .. tostring(math.random(1, 1000000000))
    token_high, token = math.floor(now * TOKEN_TICKS_PER_S), 0
    if seen_high then raise_token(seen_high, seen_low) end
    token_high_read, token_read = token_high, token
    redis.call('HSET', META, 'schema', schema, 'epoch', epoch,
      'token_high', string.format('%.0f', token_high), 'token', token)
    if expected ~= '' then
      redis.call('HSET', META, 'recovering_until', fmt(now + window))
      return epoch, true
    end
    return epoch, false
  end
  token = tonumber(m[4] or '0') or 0
  token_high = tonumber(m[8] or '0') or 0
  if seen_high then raise_token(seen_high, seen_low) end
  token_read, token_high_read = tonumber(m[4] or '0') or 0, tonumber(m[8] or '0') or 0
  maint_at = tonumber(m[5] or '0') or 0
  mine = tonumber(m[6] or '0') or 0
  mine_read = mine
  renew_at = tonumber(m[7] or '0') or 0
  local until_ = tonumber(m[3] or '')
  return m[2], (until_ ~= nil and now < until_)
end

-- The next fencing token's halves (the low half carries into the high one when full).
local function next_token()
  token = token + 1
  if token >= TOKEN_LOW then token_high, token = token_high + 1, 0 end
  return token_high, token
end

-- Renew the caller's lease: ``lease`` seconds from now. Unless ``always``, only when
-- RENEW_EVERY of the lease (a quarter) has passed since the last renewal, so that a busy
-- worker's admissions do not rewrite its lease each time (its expiry then stays at least
-- 1 - RENEW_EVERY of a lease ahead, which the engine relies on: wire.py lease_held_for).
local function renew(now, lease, always)
  if not always and now < renew_at then return end
  redis.call('ZADD', WORKERS, fmt(now + lease), ARGV[H_WORKER])
  renew_at = now + lease * RENEW_EVERY
  meta_changes[#meta_changes + 1] = renew_field(ARGV[H_WORKER])
  meta_changes[#meta_changes + 1] = fmt(renew_at)
end

-- A job of tier ``p`` and type ``t`` starts (n = 1) or stops (n = -1) running.
local function count(p, t, n)
  tiers[p] = (tiers[p] or 0) + n
  types[t] = (types[t] or 0) + n
  changed_tiers[p] = true
  changed_types[t] = true
end

local function save_hash(key, values, changed)
  local flat = {}
  for field in pairs(changed) do
    local v = values[field]
    if v <= 0 then
      values[field] = nil
      redis.call('HDEL', key, field)
    else
      flat[#flat + 1] = field
      flat[#flat + 1] = v
    end
  end
  if #flat > 0 then redis.call('HSET', key, unpack(flat)) end
end

local function flatten(values)
  local flat = {}
  for field, v in pairs(values) do
    flat[#flat + 1] = field
    flat[#flat + 1] = v
  end
  return flat
end

-- Whether ``field`` ('p:<priority>' or 't:<type>') has a slot held for an urgent job other
-- than ``uid``: 1 or 0, to count with the running jobs.
local function claimed(field, uid)
  local c = claims[field]
  if c and c.u ~= uid then return 1 end
  return 0
end

-- Hold the next free slot of ``field`` for ``uid`` for ``ttl`` seconds, unless another job's
-- live claim holds it (the first claim stands until its job starts or it lapses).
local function claim(field, uid, ttl)
  local c = claims[field]
  if c and c.u ~= uid then return end
  c = {u = uid, x = call_now + ttl}
  claims[field] = c
  redis.call('HSET', CLAIMS, field, cmsgpack.pack(c))
end

-- ``uid`` started: its claims, if any, are done.
local function unclaim(uid, prio, jtype)
  for _, field in ipairs({'p:' .. prio, 't:' .. jtype}) do
    local c = claims[field]
    if c and c.u == uid then
      claims[field] = nil
      redis.call('HDEL', CLAIMS, field)
    end
  end
end

-- The running counts with each claimed slot counted as taken.
local function with_claims(values, prefix)
  local out = {}
  for field, v in pairs(values) do out[field] = v end
  for field in pairs(claims) do
    if string.sub(field, 1, 2) == prefix then
      local name = string.sub(field, 3)
      out[name] = (out[name] or 0) + 1
    end
  end
  return out
end

-- The channel on which a call that released running jobs says how many, so that callers
-- waiting for a slot (celery_fair/slots.py) ask again at once: '{prefix}:released'.
local RELEASED = string.sub(META, 1, -5) .. 'released'

-- Write back what this call changed; returns the counts as flat {field, value, ...} lists,
-- each claimed slot counted as taken. A call that released jobs PUBLISHes their number on
-- RELEASED (no key: allowed in a script on Redis Cluster, where it reaches every node).
local function close_store()
  if released > 0 then redis.call('PUBLISH', RELEASED, released) end
  save_hash(TIERS, tiers, changed_tiers)
  save_hash(TYPES, types, changed_types)
  local m = meta_changes
  if token ~= token_read then m[#m + 1] = 'token'; m[#m + 1] = token end
  if token_high ~= token_high_read then
    m[#m + 1] = 'token_high'; m[#m + 1] = string.format('%.0f', token_high)
  end
  if mine ~= mine_read then m[#m + 1] = MINE; m[#m + 1] = mine end
  if #m > 0 then redis.call('HSET', META, unpack(m)) end
  return flatten(with_claims(tiers, 'p:')), flatten(with_claims(types, 't:'))
end

-- The key gets one more running job; true if it had none (it was idle).
local function key_active(k)
  if redis.call('HINCRBY', ACTIVE, k, 1) == 1 then
    redis.call('ZREM', SEEN, k)
    return true
  end
  return false
end

-- TEN.KMIN's member for key ``k`` of tenant ``t`` at cost ``acc``: the tenant's name after its
-- length (8 hex digits, so no tenant's members fall among another's), then the cost as a
-- big-endian double (a cost >= 0 sorts as its bytes do), then the key.
function TEN.member(t, k, acc)
  return string.format('%08x', #t) .. t .. struct.pack('>d', acc) .. k
end

-- The least cost of a running key of tenant ``t`` (nil: none runs), from TEN.KMIN.
function TEN.low(t)
  local p = string.format('%08x', #t) .. t
  local first = redis.call('ZRANGEBYLEX', TEN.KMIN, '[' .. p, '(' .. p .. '\255', 'LIMIT', 0, 1)
  if #first == 0 then return nil end
  return struct.unpack('>d', string.sub(first[1], #p + 1, #p + 8))
end

local function key_idle(k, snow, t)
  if redis.call('HINCRBY', ACTIVE, k, -1) <= 0 then
    redis.call('HDEL', ACTIVE, k)
    redis.call('ZREM', MINACC, k)
    local acc = redis.call('HGET', ACC, k)
    -- (idle from now, with a cost or not: a cost absent since a reset is 0, as its member
    -- says, and its bucket is forgotten with it)
    redis.call('ZADD', SEEN, snow, k)
    if t then redis.call('ZREM', TEN.KMIN, TEN.member(t, k, tonumber(acc or '0'))) end
  end
end

-- The tenant gets one more running job; true if it had none (it was idle).
function TEN.running(t)
  if redis.call('HINCRBY', TEN.ACTIVE, t, 1) == 1 then
    redis.call('ZREM', TEN.SEEN, t)
    return true
  end
  return false
end

function TEN.idle(t, snow)
  if redis.call('HINCRBY', TEN.ACTIVE, t, -1) <= 0 then
    redis.call('HDEL', TEN.ACTIVE, t)
    redis.call('ZREM', TEN.MINACC, t)
    redis.call('ZADD', TEN.SEEN, snow, t)
  end
end

-- Release one running job: its counts, its conflict (``rec.c`` is set only while it holds
-- one), its key and its tenant (``rec.tn``, two-level keys). The count of its worker's jobs
-- is the caller's business.
local function drop_job(uid, rec, snow)
  released = released + 1
  count(rec.p, rec.t, -1)
  if rec.c ~= '' then redis.call('HDEL', CONFLICTS, rec.c) end
  redis.call('HDEL', JOBS, uid)
  key_idle(rec.k, snow, rec.tn)
  if rec.tn then TEN.idle(rec.tn, snow) end
end

-- Note that the estimate ``ef`` was used or learned now: at most every sixteenth of its TTL,
-- since each note rewrites a sorted set entry.
local function est_used(ef, now, snow, est_ttl)
  local seen = redis.call('ZSCORE', ESTSEEN, ef)
  if not seen or tonumber(seen) < now - est_ttl / 16 then redis.call('ZADD', ESTSEEN, snow, ef) end
end

-- Give back ``est`` charged to key ``k`` (a job admitted and then given back unstarted).
-- The level at ``now`` of the rate bucket at field f of hash h (RATES: a key's, TYPE_RATES: a
-- type's): the bucket rule of core/rates.py (RATE_RULE; ``level_at``), a bucket never charged
-- being full.
local function bucket_level(h, f, rate, burst, now)
  local held = redis.call('HGET', h, f)
  if not held then return burst end
  local bar = string.find(held, '|', 1, true)
  local level, stamp = tonumber(string.sub(held, 1, bar - 1)), tonumber(string.sub(held, bar + 1))
  if now <= stamp then
    if level > burst then return burst end
    return level
  end
  local filled = level + (now - stamp) * rate
  if filled > burst then return burst end
  return filled
end

-- The bucket of the tenant ``t`` of the ask at ARGV[b ...] at ``now``, and its rate; nil
-- when the ask names no tenant or its tenant has no rate.
function TEN.bucket(t, b, now)
  local rate = t and optnum(ARGV[b + ASK_TENANT_RATE])
  if not rate then return nil end
  return bucket_level(TEN.RATES, t, rate, tonumber(ARGV[b + ASK_TENANT_BURST]), now), rate
end

-- The same as a reply says it: '' when there is no bucket.
function TEN.level(t, b, now)
  local level = TEN.bucket(t, b, now)
  return level and fmt(level) or ''
end

-- Charge the bucket of tenant ``t`` (of the ask at ARGV[b ...]) for a start of estimate
-- ``est``: 1, or ``est`` per cost. Returns {its level after it ('' = no rate), the charge}.
function TEN.charge_rate(t, b, est, now, snow)
  local level = TEN.bucket(t, b, now)
  if not level then return {''} end
  local charged = 1
  if ARGV[b + ASK_TENANT_PER_COST] == '1' then charged = est end
  local tokens = fmt(level - charged)
  redis.call('HSET', TEN.RATES, t, tokens .. '|' .. snow)
  return {tokens, charged}
end

-- Give back what an admission took from the bucket at field f of hash h (a job that never
-- started).
local function refund_rate(h, f, amount)
  local held = redis.call('HGET', h, f)
  if not held or not amount then return end
  local bar = string.find(held, '|', 1, true)
  local level = tonumber(string.sub(held, 1, bar - 1)) + tonumber(amount)
  redis.call('HSET', h, f, fmt(level) .. string.sub(held, bar))
end

local function refund(k, est, t)
  local acc = tonumber(redis.call('HGET', ACC, k) or '')
  if not acc then return end
  local sacc = fmt(math.max(0, acc - est))
  redis.call('HSET', ACC, k, sacc)
  if ARGV[H_ADVANCE_IDLE] == '1' then
    if t then  -- still running: its place among its tenant's keys moves
      redis.call('ZREM', TEN.KMIN, TEN.member(t, k, acc))
      redis.call('ZADD', TEN.KMIN, 0, TEN.member(t, k, tonumber(sacc)))
    else
      redis.call('ZADD', MINACC, sacc, k)
    end
  end
end

-- Charge key ``k`` (of tenant ``t``, nil for flat keys) ``est / weight`` for a job it starts:
-- with ``advance``, a key that ran nothing starts from the least cost of the running keys (of
-- its tenant's). Returns its cost after it and the charge, both as text.
local function charge_key(k, t, est, weight, advance)
  local acc = tonumber(redis.call('HGET', ACC, k) or '0')
  local was, fresh = acc, key_active(k)
  if fresh and advance then  -- a returning key starts from the least active cost
    local low
    if t then
      low = TEN.low(t)
    else
      low = tonumber(redis.call('ZRANGE', MINACC, 0, 0, 'WITHSCORES')[2] or '')
    end
    if low and low > acc then acc = low end
  end
  local charge = est
  if weight ~= 1 then charge = charge / weight end
  local sacc = fmt(acc + charge)
  redis.call('HSET', ACC, k, sacc)
  if advance then
    if t then  -- its place among its tenant's running keys
      if not fresh then redis.call('ZREM', TEN.KMIN, TEN.member(t, k, was)) end
      redis.call('ZADD', TEN.KMIN, 0, TEN.member(t, k, tonumber(sacc)))
    else
      redis.call('ZADD', MINACC, sacc, k)
    end
  end
  return sacc, fmt(charge)
end

-- Charge tenant ``t`` ``est / weight`` for a job one of its keys starts, as ``charge_key``
-- a key (the least cost of the running tenants with ``advance``). Returns {its cost after it,
-- the charge}, as text.
function TEN.charge(t, est, weight, advance)
  local acc = tonumber(redis.call('HGET', TEN.ACC, t) or '0')
  if TEN.running(t) and advance then
    local low = tonumber(redis.call('ZRANGE', TEN.MINACC, 0, 0, 'WITHSCORES')[2] or '')
    if low and low > acc then acc = low end
  end
  local charge = est
  if weight ~= 1 then charge = charge / weight end
  local sacc = fmt(acc + charge)
  redis.call('HSET', TEN.ACC, t, sacc)
  if advance then redis.call('ZADD', TEN.MINACC, sacc, t) end
  return {sacc, fmt(charge)}
end

-- Give back ``est`` charged to tenant ``t`` (as ``refund`` for its key).
function TEN.refund(t, est)
  local acc = tonumber(redis.call('HGET', TEN.ACC, t) or '')
  if not acc then return end
  local sacc = fmt(math.max(0, acc - est))
  redis.call('HSET', TEN.ACC, t, sacc)
  if ARGV[H_ADVANCE_IDLE] == '1' then redis.call('ZADD', TEN.MINACC, sacc, t) end
end

-- Release every job of every worker whose lease has expired (at most ``limit`` workers).
-- Rare, so it may read every running job's record. Returns the number of jobs released.
local function reclaim(now, limit)
  local dead = redis.call('ZRANGEBYSCORE', WORKERS, '-inf', '(' .. fmt(now), 'LIMIT', 0, limit)
  if #dead == 0 then return 0 end
  local gone = {}
  for _, w in ipairs(dead) do
    gone[w] = true
    redis.call('ZREM', WORKERS, w)
    redis.call('HDEL', META, mine_field(w), renew_field(w))
    if w == ARGV[H_WORKER] then mine, mine_read, renew_at = 0, 0, 0 end  -- the caller, back from a pause
  end
  local n, snow = 0, fmt(now)
  local all = redis.call('HGETALL', JOBS)
  for i = 1, #all, 2 do
    local rec = cmsgpack.unpack(all[i + 1])
    if gone[rec.w] then
      drop_job(all[i], rec, snow)
      n = n + 1
    end
  end
  return n
end

-- Forget the members of ``hash`` whose time in ``since`` is older than ``ttl``; at most ``limit``.
local function expire(hash, since, now, ttl, limit, also)
  local old = redis.call('ZRANGEBYSCORE', since, '-inf', fmt(now - ttl), 'LIMIT', 0, limit)
  for _, field in ipairs(old) do
    redis.call('HDEL', hash, field)
    if also then redis.call('HDEL', also, field) end
    redis.call('ZREM', since, field)
  end
end

-- Bounded housekeeping: TTLs of idle keys, unused estimates and tombstones (at most ``limit``
-- evictions of each per call), and the periodic reset. With ``every``, only if the last
-- housekeeping (by any caller) is at least that many seconds old.
local function maintain(now, cost_ttl, est_ttl, reset_interval, limit, every)
  if every then
    if now < maint_at then return end
    meta_changes[#meta_changes + 1] = 'maint_at'
    meta_changes[#meta_changes + 1] = fmt(now + every)
  end
  limit = limit or 64
  if cost_ttl then
    expire(ACC, SEEN, now, cost_ttl, limit, RATES)
    expire(TEN.ACC, TEN.SEEN, now, cost_ttl, limit, TEN.RATES)
  end
  if est_ttl then expire(EST, ESTSEEN, now, est_ttl, limit) end
  local dedupe = tonumber(ARGV[H_DEDUPE])
  if dedupe > 0 then
    local old = redis.call('ZRANGEBYSCORE', DONE, '-inf', fmt(now - dedupe), 'LIMIT', 0, limit)
    if #old > 0 then redis.call('ZREM', DONE, unpack(old)) end
  end
  if reset_interval then
    local at = tonumber(redis.call('HGET', META, 'reset_at') or '')
    if at == nil then
      redis.call('HSET', META, 'reset_at', fmt(now + reset_interval))
    elseif now >= at then
      while at <= now do at = at + reset_interval end
      redis.call('HSET', META, 'reset_at', fmt(at))
      -- (idle keys and tenants keep their idle time: their buckets expire with it)
      redis.call('DEL', ACC, TEN.ACC)
      local active = redis.call('ZRANGE', MINACC, 0, -1)
      for _, k in ipairs(active) do redis.call('ZADD', MINACC, 0, k) end
      for _, t in ipairs(redis.call('ZRANGE', TEN.MINACC, 0, -1)) do redis.call('ZADD', TEN.MINACC, 0, t) end
      local members = redis.call('ZRANGE', TEN.KMIN, 0, -1)
      if #members > 0 then
        redis.call('DEL', TEN.KMIN)
        for _, m in ipairs(members) do
          local n = tonumber(string.sub(m, 1, 8), 16)
          redis.call('ZADD', TEN.KMIN, 0, TEN.member(string.sub(m, 9, 8 + n), string.sub(m, 17 + n), 0))
        end
      end
    end
  end
end

-- Finish ``n`` running jobs given as (uid, token, elapsed, how) from ARGV[b]: each fenced by
-- its token; with an elapsed time the estimate learns alpha * elapsed + (1 - alpha) * previous;
-- how is '1' for a final one, which leaves a tombstone, 'u' for one that never started, whose
-- charge goes back to its key, else '0'. Returns {status, estimate} per job; status F_APPLIED or
-- F_STALE (store/wire.py).
local function finish_jobs(b, n, now, snow)
  local alpha, est_ttl, dedupe = tonumber(ARGV[H_ALPHA]), optnum(ARGV[H_ESTIMATE_TTL]), tonumber(ARGV[H_DEDUPE])
  local results = {}
  for i = 0, n - 1 do
    local at = b + i * FIN_N
    local uid, toh, tok = ARGV[at + FIN_UID], parse_token(ARGV[at + FIN_TOKEN])
    local elapsed = optnum(ARGV[at + FIN_ELAPSED])
    local packed = redis.call('HGET', JOBS, uid)
    local rec = packed and cmsgpack.unpack(packed)
    if not rec or rec.toh ~= toh or rec.tok ~= tok then
      results[#results + 1] = {F_STALE, ''}
    else
      local value = redis.call('HGET', EST, rec.e)
      if not value then value = rec.d end
      if elapsed then
        value = fmt(alpha * elapsed + (1 - alpha) * tonumber(value))
        redis.call('HSET', EST, rec.e, value)
        -- Its admission noted the estimate as used (rec.u) less than a sixteenth of the TTL
        -- ago: the note stands (at most two sixteenths old), one read saved per job.
        if est_ttl and not (rec.u and now - tonumber(rec.at) < est_ttl / 16) then
          est_used(rec.e, now, snow, est_ttl)
        end
      end
      local how = ARGV[at + FIN_HOW]
      if how == 'u' then
        refund(rec.k, tonumber(rec.est), rec.tn)
        if rec.tn then TEN.refund(rec.tn, tonumber(rec.tst)) end
        refund_rate(RATES, rec.k, rec.rc)
        refund_rate(TYPE_RATES, rec.t, rec.trc)
        if rec.tn then refund_rate(TEN.RATES, rec.tn, rec.ttc) end
      end
      drop_job(uid, rec, snow)
      if rec.w == ARGV[H_WORKER] then
        mine = mine - 1
      else  -- another worker's job, finished for it (register after a lease loss)
        redis.call('HINCRBY', META, mine_field(rec.w), -1)
      end
      if dedupe > 0 and how == '1' then redis.call('ZADD', DONE, snow, uid) end
      results[#results + 1] = {F_APPLIED, value}
    end
  end
  return results
end
