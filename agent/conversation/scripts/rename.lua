-- Rename: only a conversation that exists (a rename never creates one); its TTL and place are kept.
-- KEYS: meta. ARGV: the new title. Returns 1, or 0 when there was no conversation.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'title', ARGV[1])
return 1
