-- Renew a running turn's heartbeat mark. While the mark is this job's, only its TTL is renewed (PEXPIRE
-- adds nothing, so Redis takes it even at its maxmemory: a full Redis does not make a live worker look
-- lost); otherwise (lapsed, or another job's) it is set.
-- KEYS: the mark (agent:turn:{turn}:alive). ARGV: the job's id, the TTL in ms. Returns 1.
local mark, job_id, ttl_ms = KEYS[1], ARGV[1], ARGV[2]
if redis.call('GET', mark) == job_id and redis.call('PEXPIRE', mark, ttl_ms) == 1 then return 1 end
redis.call('SET', mark, job_id, 'PX', ttl_ms)
return 1
