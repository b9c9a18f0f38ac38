-- Renew a running turn's heartbeat: its mark, and its lease in the index of running turns, scored by when
-- the lease lapses (ms on Redis's own clock), so that a watch finds the lapsed ones in one range read,
-- whatever the number running. While the mark is this job's, only its TTL is renewed (PEXPIRE adds
-- nothing, so Redis takes it even at its maxmemory, and the lease's score after it: a full Redis does not
-- make a live worker look lost); otherwise (lapsed, or another job's) it is set.
-- KEYS: the mark (agent:turn:{turn}:alive), the running index (agent:turns:running)
-- ARGV: the job's id, the TTL in ms, the conversation id, '1' when the turn starts running (it enters the
-- index), '0' to renew (only while it is in the index: an ended turn's late beat does not bring it back).
-- Returns 1.
local mark, running = KEYS[1], KEYS[2]
local job_id, ttl_ms, conversation_id, start = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4] == '1'
if not (redis.call('GET', mark) == job_id and redis.call('PEXPIRE', mark, ttl_ms) == 1) then
  redis.call('SET', mark, job_id, 'PX', ttl_ms)
end
local now = redis.call('TIME')
local lapses_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + ttl_ms
if start then
  redis.call('ZADD', running, lapses_ms, conversation_id)
else
  redis.call('ZADD', running, 'XX', lapses_ms, conversation_id)
end
return 1
