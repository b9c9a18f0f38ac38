-- Answer a parked turn's request for approval, once: only while that request is the one waiting. The
-- answer's step is appended, the small fields replaced (the turn waits for its continuation, or runs on
-- in the job that waits for it with safeguards off), and the job that continues it owns it from now on.
-- KEYS: meta, steps, events, approvals, index, history, turns, live
-- ARGV: turn_id, request id, doc, step (JSON), new owner, conversation_id, updated_at, ttl, person (the signed-in
-- person answering; '' for the local playground, the operator and the expiry).
-- Returns {outcome, version}: 'ok'; 'taken' (not that request waiting: answered already, or none);
-- 'ended' (the turn is not in flight); 'gone' (no such conversation, or not the person's: told alike).
local meta, steps, events, approvals, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local turn_id, request_id, doc, step, new_owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local conversation_id, updated_at, ttl = ARGV[6], ARGV[7], tonumber(ARGV[8])
local current = redis.call('HMGET', meta, 'turn_id', 'done', 'approval', 'owned_by')
if not current[1] then return {'gone', '0'} end
if ARGV[9] ~= '' and current[4] ~= ARGV[9] then return {'gone', '0'} end
if current[1] ~= turn_id or current[2] == '1' then return {'ended', '0'} end
if current[3] ~= request_id then return {'taken', '0'} end
redis.call('RPUSH', steps, step)
redis.call('HINCRBY', meta, 'bytes', #step)
local version = redis.call('HINCRBY', meta, 'version', 1)
redis.call('HSET', meta, 'doc', doc, 'owner', new_owner)
redis.call('HDEL', meta, 'approval')
redis.call('ZREM', approvals, conversation_id)
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
for i = 1, #KEYS do
  if i ~= 4 and i ~= 5 then redis.call('EXPIRE', KEYS[i], ttl) end
end
redis.call('ZADD', index, updated_at, conversation_id)
return {'ok', tostring(version)}
