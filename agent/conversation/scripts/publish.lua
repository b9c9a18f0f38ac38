-- One atomic write of a turn: append what is new to the turn's record in the tree (scripts/included/tree.lua), replace the
-- small fields, bump the version (the conversation's and the turn's).
-- Refused (an error reply) when the conversation is GONE, another turn is current (STALE), the turn has
-- already ended (CLOSED: done never reverts), the turn's messages moved underneath (CONFLICT), or another job
-- owns the turn's writes now (STALE: it was resumed elsewhere while this job's worker was away).
-- KEYS: meta, tree, events, index, live, running (the turns in flight), approvals (the parked turns: an ending
-- ends a parked turn's request too), reserved (the turns' memory reservations)
-- An ending's first write releases the turn's reservation and its live text: a script that has written once
-- runs to its end even when Redis is at its maxmemory, so the ending lands on the memory the turn reserved.
-- ARGV: turn_id, expected number of the turn's messages (-1: any), doc, done ('1' or '0'), ttl, number of
-- messages, number of steps, turn summary ('' for none), conversation_id, updated_at, end_live (a live text's seq,
-- 0: none), writer (the writing job's id; '' for a front end, which may end any job's turn), person (a signed-in
-- person's front end: only a conversation of theirs; '' for jobs, the local playground and the operator), the
-- conversation's key prefix, then the messages, then the steps. Returns the new version.
--@include included/tree
local meta, tree, events, index, live = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local running, approvals, reserved = KEYS[6], KEYS[7], KEYS[8]
local turn_id, expected_len, doc, done, ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5])
local n_messages, n_steps = tonumber(ARGV[6]), tonumber(ARGV[7])
local summary, conversation_id, updated_at, end_live = ARGV[8], ARGV[9], ARGV[10], tonumber(ARGV[11])
local writer, person, base = ARGV[12], ARGV[13], ARGV[14]
local current = redis.call('HMGET', meta, 'turn_id', 'done', 'owned_by')
if not current[1] or (person ~= '' and current[3] ~= person) then
  return redis.error_reply('GONE the conversation has expired or was deleted')
end
-- Moved into the tree before the writer is read: a conversation of the flat shape names it `owner`.
migrate(meta, base)
if current[1] ~= turn_id then return redis.error_reply('STALE another turn is current') end
if current[2] == '1' then return redis.error_reply('CLOSED the turn has already ended') end
local current_writer = redis.call('HGET', meta, 'writer')
if writer ~= '' and current_writer and current_writer ~= writer then
  return redis.error_reply('STALE the turn was resumed by another job')
end
local have = tonumber(redis.call('HGET', tree, turn_id .. ':n') or '0')
if expected_len >= 0 and have ~= expected_len then
  return redis.error_reply('CONFLICT the turn\'s messages moved')
end
if done == '1' then
  redis.call('ZREM', reserved, conversation_id .. ' ' .. turn_id)
  redis.call('DEL', live)
end
local i, added = 15, #summary
for _ = 1, n_messages do
  redis.call('HSET', tree, turn_id .. ':m:' .. have, ARGV[i]); added = added + #ARGV[i]
  have = have + 1; i = i + 1
end
if n_messages > 0 then redis.call('HSET', tree, turn_id .. ':n', have) end
-- A job's steps are numbered (`index`, one turn's steps from 1 up, across its resumes): a step at or below
-- the highest index a job's write already stored for this turn is not stored again. So a write run twice
-- (a client's retry of a write that timed out but ran, or a write sent again after one that seemed lost)
-- never records a step twice, even when it carries no message for the history check to see.
local mark = redis.call('HMGET', meta, 'step_turn', 'step_index')
local floor = -1
if writer ~= '' and mark[1] == turn_id then floor = tonumber(mark[2] or '-1') or -1 end
local top = floor
local n_stored = tonumber(redis.call('HGET', tree, turn_id .. ':s') or '0')
local stored = n_stored
for _ = 1, n_steps do
  local ok, step = pcall(cjson.decode, ARGV[i])
  local index = ok and type(step) == 'table' and tonumber(step['index']) or nil
  if writer == '' or index == nil or index > floor then
    redis.call('HSET', tree, turn_id .. ':s:' .. n_stored, ARGV[i]); added = added + #ARGV[i]
    n_stored = n_stored + 1
    if index ~= nil and index > top then top = index end
  end
  i = i + 1
end
if n_stored ~= stored then redis.call('HSET', tree, turn_id .. ':s', n_stored) end
if writer ~= '' and top > floor then redis.call('HSET', meta, 'step_turn', turn_id, 'step_index', top) end
if summary ~= '' then redis.call('HSET', tree, turn_id .. ':sum', summary, turn_id .. ':doc', doc) end
redis.call('HINCRBY', tree, turn_id .. ':v', 1)
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
  redis.call('ZREM', approvals, conversation_id)
  redis.call('HDEL', meta, 'approval')
end
if done == '1' or (live_seq > 0 and live_seq <= end_live) then
  redis.call('HDEL', meta, 'live', 'live_seq')
  redis.call('DEL', live)
end
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
for _, key in ipairs({meta, tree, events, live}) do redis.call('EXPIRE', key, ttl) end
redis.call('ZADD', index, updated_at, conversation_id)
return version
