-- The running turns whose lease has lapsed (scripts/beat.lua), by Redis's own clock: one range read,
-- whatever the number running. KEYS: the running index. ARGV: the most to return.
-- Returns the conversation ids, the longest lapsed first.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms, 'LIMIT', 0, tonumber(ARGV[1]))
