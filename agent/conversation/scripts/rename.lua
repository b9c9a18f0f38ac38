-- Rename: only a conversation that exists (a rename never creates one); its TTL and place are kept. A title a
-- person gave stays whichever branch is shown (scripts/switch.lua).
-- KEYS: meta; for a signed-in person, also their conversations (the person's index).
-- ARGV: the new title, the person ('' for the local playground and the operator), the conversation id, now.
-- Returns 1, or 0 when there was no conversation, or it is not the person's (told alike).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local person = ARGV[2]
if person ~= '' then
  if redis.call('HGET', KEYS[1], 'owned_by') ~= person then return 0 end
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
end
redis.call('HSET', KEYS[1], 'title', ARGV[1], 'renamed', '1')  -- a branch shown no longer retitles it
return 1
