-- Park a turn on a request for a person's approval: the job that writes it lets go (writer ''), so its
-- worker is free and none of its later writes lands; the request waits in the approvals index, scored by
-- when it expires, until it is answered (answer.lua) or the turn ends.
-- KEYS: meta, events, running (the turns in flight), approvals, index, tree, live
-- ARGV: turn_id, writer (the parking job), doc, request id, expires_at, conversation_id, updated_at, ttl, hold
-- ('1': the job keeps the turn and waits for the answer itself, as with safeguards off), the key prefix.
-- Returns the new version; refused like a publish (GONE, STALE, CLOSED).
local meta, events, running, approvals, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local turn_id, writer, doc, request_id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
--@include included/tree
migrate(meta, ARGV[10])
local expires_at, conversation_id, updated_at, ttl, hold = ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8]), ARGV[9]
local current = redis.call('HMGET', meta, 'turn_id', 'done', 'writer')
if not current[1] then return redis.error_reply('GONE the conversation has expired or was deleted') end
if current[1] ~= turn_id then return redis.error_reply('STALE another turn is current') end
if current[2] == '1' then return redis.error_reply('CLOSED the turn has already ended') end
if (current[3] or '') ~= writer then return redis.error_reply('STALE the turn was resumed by another job') end
local version = redis.call('HINCRBY', meta, 'version', 1)
redis.call('HSET', meta, 'doc', doc, 'approval', request_id)
if hold ~= '1' then
  redis.call('HSET', meta, 'writer', '')
  redis.call('ZREM', running, conversation_id)
end
redis.call('ZADD', approvals, expires_at, conversation_id)
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
for i = 1, #KEYS do
  if i ~= 3 and i ~= 4 and i ~= 5 then redis.call('EXPIRE', KEYS[i], ttl) end
end
redis.call('ZADD', index, updated_at, conversation_id)
return version
