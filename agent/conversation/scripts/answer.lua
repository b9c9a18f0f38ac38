-- Answer a parked turn's request for approval, once: only while that request is the one waiting, and (for a
-- person's answer) only before it expires by Redis's own clock, so that no clock of a front end can let a
-- late answer through. The answer's step is appended, the small fields replaced (the turn waits for its
-- continuation, or runs on in the job that waits for it with safeguards off), and the job that continues it
-- owns it from now on; with a continuation, the turn enters the index the pool's watch looks at until that
-- job is seen on the queue (it is enqueued after this script: if it never gets there, the watch enqueues it).
-- A new writer (a continuation) gets the turn's claim freed (scripts/claim.lua): the job that parked held it.
-- KEYS: meta, tree, events, approvals, index, live, continuing, the turn's claim
-- (the step is appended to the turn's record in the tree, scripts/included/tree.lua)
-- ARGV: turn_id, request id, doc, step (JSON), new writer (the job that continues it), conversation_id, updated_at, ttl, person (the signed-in
-- person answering; '' for the local playground, the operator and the expiry), decision ('expired' for the
-- expiry itself, which is never late), look_at ('' without a continuation: when the watch looks for its job),
-- the conversation's key prefix.
-- Returns {outcome, version}: 'ok'; 'taken' (not that request waiting: answered already, or none);
-- 'late' (the request expired before this answer); 'ended' (the turn is not in flight); 'gone' (no such
-- conversation, or not the person's: told alike).
--@include included/tree
local meta, tree, events, approvals, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local continuing = KEYS[7]
local turn_id, request_id, doc, step, new_writer = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local conversation_id, updated_at, ttl = ARGV[6], ARGV[7], tonumber(ARGV[8])
local decision, look_at = ARGV[10], ARGV[11]
migrate(meta, ARGV[12])
local current = redis.call('HMGET', meta, 'turn_id', 'done', 'approval', 'owned_by', 'writer')
if not current[1] then return {'gone', '0'} end
if ARGV[9] ~= '' and current[4] ~= ARGV[9] then return {'gone', '0'} end
if current[1] ~= turn_id or current[2] == '1' then return {'ended', '0'} end
if current[3] ~= request_id then return {'taken', '0'} end
if decision ~= 'expired' then
  local expires_at = redis.call('ZSCORE', approvals, conversation_id)
  local now = redis.call('TIME')
  if expires_at and tonumber(now[1]) + tonumber(now[2]) / 1000000 >= tonumber(expires_at) then
    return {'late', '0'}
  end
end
local n = redis.call('HINCRBY', tree, turn_id .. ':s', 1)
redis.call('HSET', tree, turn_id .. ':s:' .. (n - 1), step)
redis.call('HINCRBY', tree, turn_id .. ':v', 1)
redis.call('HINCRBY', meta, 'bytes', #step)
local version = redis.call('HINCRBY', meta, 'version', 1)
if (current[5] or '') ~= new_writer then redis.call('DEL', KEYS[8]) end
redis.call('HSET', meta, 'doc', doc, 'writer', new_writer)
redis.call('HDEL', meta, 'approval')
redis.call('ZREM', approvals, conversation_id)
if look_at ~= '' then redis.call('ZADD', continuing, look_at, conversation_id) end
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
for _, key in ipairs({meta, tree, events, KEYS[6]}) do redis.call('EXPIRE', key, ttl) end
redis.call('ZADD', index, updated_at, conversation_id)
return {'ok', tostring(version)}
