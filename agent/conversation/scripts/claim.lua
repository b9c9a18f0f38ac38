-- A job claims the turn it was enqueued for, once, and is watched from that instant: only while the turn is
-- in flight and the job writes it (meta's writer: a job the turn was handed to since, by a resume, an answer
-- or a re-queue, owns it instead, and this one must not start it), and only while nobody holds the claim (a job
-- delivered twice, or run again after a crash, finds it taken; a hand-over, scripts/resume.lua and answer.lua,
-- frees it for the job it hands the turn to, in the same step that makes that job the writer). In the same step
-- its heartbeat mark is set and the turn enters the index of running turns (as scripts/beat.lua), so that there
-- is no instant at which a claimed turn is not watched: a worker lost before its claim leaves a job that never
-- began the turn, which its finders queue again.
-- KEYS: meta, the claim (agent:turn:{turn}:claim), the mark (agent:turn:{turn}:alive), the running index
-- ARGV: turn_id, job id, the claim's TTL (s), the mark's TTL (ms), conversation_id, its key prefix
-- Returns 'ok', 'ended' (not this turn, or not in flight), 'not its job' (another job writes it), or 'duplicate'
-- (the claim is held: this job, or one before the turn was last handed over, ran it already).
local meta, claim, mark, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local turn_id, job_id, claim_ttl, alive_ms, conversation_id = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]),
  ARGV[5]
--@include included/tree
migrate(meta, ARGV[6])
local current = redis.call('HMGET', meta, 'turn_id', 'done', 'writer')
if current[1] ~= turn_id or current[2] ~= '0' then return 'ended' end
if (current[3] or '') ~= job_id then return 'not its job' end
if redis.call('EXISTS', claim) == 1 then return 'duplicate' end
redis.call('SET', claim, job_id, 'EX', claim_ttl)
redis.call('SET', mark, job_id, 'PX', alive_ms)
local now = redis.call('TIME')
redis.call('ZADD', running, tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + alive_ms, conversation_id)
return 'ok'
