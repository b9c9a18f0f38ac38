-- The live text's write: refused like a publish (GONE, STALE, CLOSED); 'ended' once its text was
-- cleared (a late write); 'lag' when an append does not start where the stored text ends (an earlier
-- write was lost), so the writer sends the whole text instead.
-- KEYS: meta, live, events, tree (its TTL refreshed)
-- ARGV: turn_id, ttl, head (JSON), seq, mode ('whole' or 'append'), from (bytes), text, writer (the job's id), the
-- conversation's key prefix
-- Returns {outcome, version}.
local meta, live, events = KEYS[1], KEYS[2], KEYS[3]
local turn_id, ttl, head, seq, mode = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[5]
local from, text, writer = tonumber(ARGV[6]), ARGV[7], ARGV[8]
--@include included/tree
migrate(meta, ARGV[9])
local current = redis.call('HMGET', meta, 'turn_id', 'done', 'live_seq', 'live_ended', 'writer')
if not current[1] then return redis.error_reply('GONE the conversation has expired') end
if current[1] ~= turn_id then return redis.error_reply('STALE another turn is current') end
if current[2] == '1' then return redis.error_reply('CLOSED the turn has already ended') end
if writer ~= '' and current[5] and current[5] ~= writer then
  return redis.error_reply('STALE the turn was resumed by another job')
end
-- Ended, or older than the text Redis holds (a write that stalled while a retry started a fresh text).
if seq <= tonumber(current[4] or '0') or seq < tonumber(current[3] or '0') then return {'ended', 0} end
if mode == 'append' then
  if tonumber(current[3] or '0') ~= seq or redis.call('STRLEN', live) ~= from then return {'lag', 0} end
  redis.call('APPEND', live, text)
else
  redis.call('SET', live, text)
end
redis.call('HSET', meta, 'live', head, 'live_seq', seq)
local version = redis.call('HINCRBY', meta, 'version', 1)
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, ttl) end
return {'ok', version}
