-- Delete a conversation: its keys, its index entry, and a marker that says it was deleted; the entry on
-- its gone stream wakes every reader blocked on it.
-- KEYS: meta, history, steps, turns, events, live, index, deleted marker, gone stream, approvals
-- ARGV: conversation_id, the marker's TTL, the gone stream's TTL. Returns how many of its keys existed.
local existed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
redis.call('ZREM', KEYS[7], ARGV[1])
redis.call('ZREM', KEYS[10], ARGV[1])
redis.call('SET', KEYS[8], '1', 'EX', tonumber(ARGV[2]))
redis.call('XADD', KEYS[9], 'MAXLEN', '~', 1, '*', 'gone', '1')
redis.call('EXPIRE', KEYS[9], tonumber(ARGV[3]))
return existed
