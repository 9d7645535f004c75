-- celery-fair: the record of an idempotent submission (submissions.py), on keys of its own.
-- A producer claims a pending record, publishes, then confirms it (or forgets it when the
-- publish fails or a limit refuses it), so a duplicate never gets the task id of a message
-- that was not published: it sees 'pending' and waits for the outcome.
--
-- KEYS (one hash tag, so one slot):
--   1 {p}:submitted:<field>   string, with a TTL: the task id of the published submission
--   2 {p}:submitting:<field>  string, with a TTL: the task id of the pending one
-- ARGV[1] is the operation, ARGV[2] the task id, ARGV[3] a time to live in milliseconds:
--   claim    -> {} when the pending record is now this task's (kept ARGV[3] ms), else
--               {task id, 1 published | 0 pending} of the submission recorded first
--   confirm  -> 1 when the pending record was this task's (dropped), 0 when it was gone; the
--               published record is then this task's, kept ARGV[3] ms, unless there is one
--               already (a submit that published after its pending record lapsed: the first
--               published stays)
--   forget   -> 1 when the pending record was this task's and is dropped, else 0
-- Cost: O(1).

local published, pending = KEYS[1], KEYS[2]
local op, id = ARGV[1], ARGV[2]

if op == 'claim' then
  local held = redis.call('GET', published)
  if held then return {held, 1} end
  held = redis.call('GET', pending)
  if held then return {held, 0} end
  redis.call('SET', pending, id, 'PX', ARGV[3])
  return {}
end

if op == 'confirm' then
  local own = redis.call('GET', pending) == id
  if own then redis.call('DEL', pending) end
  if redis.call('EXISTS', published) == 0 then
    redis.call('SET', published, id, 'PX', ARGV[3])
  end
  return own and 1 or 0
end

if op == 'forget' then
  if redis.call('GET', pending) == id then return redis.call('DEL', pending) end
  return 0
end

return redis.error_reply('submission.lua: unknown operation ' .. tostring(op))
