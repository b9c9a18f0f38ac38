-- Delete a conversation: its keys (its tree of turns is one of them), its index entry, and a marker that says it was
-- deleted; the entry on its gone stream wakes every reader blocked on it.
-- KEYS: meta, history, steps, turns (the flat shape's lists, scripts/included/tree.lua), events, live, tree, index, deleted
-- marker, gone stream, approvals; for a signed-in person, also their conversations (the person's index)
-- ARGV: conversation_id, the marker's TTL, the gone stream's TTL, the person ('' for the local playground and the
-- operator). Returns how many of its keys existed: 0 as well when it is not the person's (nothing is deleted).
local person = ARGV[4]
if person ~= '' then
  if redis.call('HGET', KEYS[1], 'owned_by') ~= person then return 0 end
  redis.call('ZREM', KEYS[12], ARGV[1])
end
local existed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
redis.call('ZREM', KEYS[8], ARGV[1])
redis.call('ZREM', KEYS[11], ARGV[1])
-- The marker names who deleted it, so that it is told only to them (a person's own link says "deleted").
redis.call('SET', KEYS[9], person ~= '' and person or '1', 'EX', tonumber(ARGV[2]))
redis.call('XADD', KEYS[10], 'MAXLEN', '~', 1, '*', 'gone', '1')
redis.call('EXPIRE', KEYS[10], tonumber(ARGV[3]))
return existed
