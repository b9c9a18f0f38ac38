-- One atomic write of a turn: append what is new, replace the small fields, bump the version.
-- Refused (an error reply) when the conversation is GONE, another turn is current (STALE), the turn has
-- already ended (CLOSED: done never reverts), the history moved underneath (CONFLICT), or another job
-- owns the turn now (STALE: it was resumed elsewhere while this job's worker was away).
-- KEYS: meta, history, steps, turns, events, index, live, running (the turns in flight), approvals (the
-- parked turns: an ending ends a parked turn's request too), reserved (the turns' memory reservations)
-- An ending's first write releases the turn's reservation and its live text: a script that has written once
-- runs to its end even when Redis is at its maxmemory, so the ending lands on the memory the turn reserved.
-- ARGV: turn_id, expected history length (-1: any), doc, done ('1' or '0'), ttl, number of messages, number
-- of steps, turn summary ('' for none), conversation_id, updated_at, end_live (a live text's seq, 0: none),
-- owner (the writing job's id; '' for a front end, which may end any job's turn), person (a signed-in person's
-- front end: only a conversation of theirs; '' for jobs, the local playground and the operator), then the
-- messages, then the steps. Returns the new version.
local meta, history, steps, turns, events, index, live = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local running = KEYS[8]
local turn_id, expected_len, doc, done, ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5])
local n_messages, n_steps = tonumber(ARGV[6]), tonumber(ARGV[7])
local summary, conversation_id, updated_at, end_live = ARGV[8], ARGV[9], ARGV[10], tonumber(ARGV[11])
local owner, person = ARGV[12], ARGV[13]
local current = redis.call('HMGET', meta, 'turn_id', 'done', 'owner', 'owned_by')
if not current[1] or (person ~= '' and current[4] ~= person) then
  return redis.error_reply('GONE the conversation has expired or was deleted')
end
if current[1] ~= turn_id then return redis.error_reply('STALE another turn is current') end
if current[2] == '1' then return redis.error_reply('CLOSED the turn has already ended') end
if owner ~= '' and current[3] and current[3] ~= owner then
  return redis.error_reply('STALE the turn was resumed by another job')
end
if expected_len >= 0 and redis.call('LLEN', history) ~= expected_len then
  return redis.error_reply('CONFLICT the history moved')
end
if done == '1' then
  redis.call('ZREM', KEYS[10], conversation_id .. ' ' .. turn_id)
  redis.call('DEL', live)
end
local i, added = 14, #summary
for _ = 1, n_messages do redis.call('RPUSH', history, ARGV[i]); added = added + #ARGV[i]; i = i + 1 end
-- A job's steps are numbered (`index`, one turn's steps from 1 up, across its resumes): a step at or below
-- the highest index a job's write already stored for this turn is not stored again. So a write run twice
-- (a client's retry of a write that timed out but ran, or a write sent again after one that seemed lost)
-- never records a step twice, even when it carries no message for the history check to see.
local mark = redis.call('HMGET', meta, 'step_turn', 'step_index')
local floor = -1
if owner ~= '' and mark[1] == turn_id then floor = tonumber(mark[2] or '-1') or -1 end
local top = floor
for _ = 1, n_steps do
  local ok, step = pcall(cjson.decode, ARGV[i])
  local index = ok and type(step) == 'table' and tonumber(step['index']) or nil
  if owner == '' or index == nil or index > floor then
    redis.call('RPUSH', steps, ARGV[i]); added = added + #ARGV[i]
    if index ~= nil and index > top then top = index end
  end
  i = i + 1
end
if owner ~= '' and top > floor then redis.call('HSET', meta, 'step_turn', turn_id, 'step_index', top) end
if summary ~= '' then redis.call('RPUSH', turns, summary) end
redis.call('HINCRBY', meta, 'bytes', added)
local version = redis.call('HINCRBY', meta, 'version', 1)
redis.call('HSET', meta, 'done', done, 'doc', doc)
if end_live > 0 then
  local ended = tonumber(redis.call('HGET', meta, 'live_ended') or '0')
  if end_live > ended then redis.call('HSET', meta, 'live_ended', end_live) end
end
local live_seq = tonumber(redis.call('HGET', meta, 'live_seq') or '0')
if done == '1' then
  redis.call('ZREM', running, conversation_id)
  redis.call('ZREM', KEYS[9], conversation_id)
  redis.call('HDEL', meta, 'approval')
end
if done == '1' or (live_seq > 0 and live_seq <= end_live) then
  redis.call('HDEL', meta, 'live', 'live_seq')
  redis.call('DEL', live)
end
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
for _, key in ipairs({meta, history, steps, turns, events, live}) do redis.call('EXPIRE', key, ttl) end
redis.call('ZADD', index, updated_at, conversation_id)
return version
