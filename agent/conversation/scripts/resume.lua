-- Hand a turn whose worker was lost to a new job, once: only while the lost job still owns it, and only
-- while resumes are left. Every later write of the lost job is refused (STALE), so two jobs never write
-- one turn.
-- The claim (scripts/claim.lua) is freed for the new job: the lost one claimed it, or died before it could.
-- KEYS: meta, alive (the turn's heartbeat mark), the turn's claim
-- ARGV: turn_id, lost writer (the job whose worker was lost), new writer (the job that continues it),
-- max resumes, alive ttl (ms: the new job's grace to start beating), '1' when the lost job's mark is no sign of
-- life: the writer hands the turn over itself (its app is stopping), or the caller saw its process end; else '0'
-- Returns {outcome, attempt}: 'ok' (attempt: the new one), 'taken' (another job owns it: resumed already,
-- or not lost), 'ended' (no such turn in flight), 'spent' (attempt: the resumes already made).
local meta, alive = KEYS[1], KEYS[2]
local turn_id, lost, new, max_resumes, alive_ms = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local by_itself = ARGV[6] == '1'
--@include included/tree
migrate(meta, ARGV[7])
local current = redis.call('HMGET', meta, 'turn_id', 'done', 'writer', 'attempt')
if current[1] ~= turn_id or current[2] ~= '0' then return {'ended', '0'} end
if (current[3] or '') ~= lost then return {'taken', current[4] or '0'} end
-- Its mark is back (the worker beat again since the caller looked, e.g. once a paused Redis resumed): not lost.
if not by_itself and redis.call('GET', alive) == lost then return {'taken', current[4] or '0'} end
local attempt = tonumber(current[4] or '0')
if attempt >= max_resumes then return {'spent', tostring(attempt)} end
attempt = attempt + 1
redis.call('HSET', meta, 'writer', new, 'attempt', attempt)
redis.call('SET', alive, new, 'PX', alive_ms)
redis.call('DEL', KEYS[3])
return {'ok', tostring(attempt)}
