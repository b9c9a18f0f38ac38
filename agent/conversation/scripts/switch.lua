-- Show another branch: the conversation's tip becomes the latest turn down the branch through `turn` (at each fork
-- below it, the newest child), so a reload, every tab and the CLI show it; the next message continues it.
-- Refused while a turn is in flight or parked (it is the one shown until it ends).
-- KEYS: meta, tree, events, index; ARGV: turn, updated_at, person ('' for the local playground and the operator),
-- conversation_id, the conversation's key prefix, the TTL (refreshed, as by every write)
-- Returns {outcome, value}: 'ok' (value: the tip now), 'busy' (value: the turn in flight), 'no turn', 'gone' (no
-- such conversation, or not the person's).
--@include included/tree
local meta, tree, events, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local turn, updated_at, person, conversation_id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local current = redis.call('HMGET', meta, 'turn_id', 'done', 'owned_by', 'tip')
if not current[1] or (person ~= '' and current[3] ~= person) then return {'gone', ''} end
if current[2] ~= '1' then return {'busy', current[1]} end
migrate(meta, ARGV[5])
if not redis.call('HGET', tree, turn .. ':parent') then return {'no turn', turn} end
local tip = turn
for _ = 1, 100000 do
  local kids = redis.call('HGET', tree, tip .. ':kids')
  if not kids or kids == '' then break end
  tip = string.match(kids, '(%S+)$')
end
if tip == redis.call('HGET', meta, 'tip') then return {'ok', tip} end
local version = redis.call('HINCRBY', meta, 'version', 1)
show(meta, tree, tip)
redis.call('HINCRBY', meta, 'tree_v', 1)
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
redis.call('ZADD', index, updated_at, conversation_id)
for _, key in ipairs({meta, tree, events}) do redis.call('EXPIRE', key, tonumber(ARGV[6])) end
return {'ok', tip}
