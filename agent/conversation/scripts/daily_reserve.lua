-- A signed-in person's daily budget, checked and reserved in one step when a message is sent.
-- KEYS[1] the person's day (agent:person:{person}:spend:{day}): spent, reserved (picodollars)
-- ARGV[1] the daily budget, ARGV[2] what the turn asks for (0: all that is left), ARGV[3] the least a turn
-- may start with, ARGV[4] the key's TTL (seconds). Returns {1, granted} or {0, spent and reserved}.
local spent = tonumber(redis.call('HGET', KEYS[1], 'spent') or '0')
local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved') or '0')
local left = tonumber(ARGV[1]) - spent - reserved
if left < tonumber(ARGV[3]) then
  return {0, string.format('%d', spent + reserved)}
end
local grant = left
local want = tonumber(ARGV[2])
if want > 0 and want < grant then
  grant = want
end
redis.call('HINCRBY', KEYS[1], 'reserved', string.format('%d', grant))
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {1, string.format('%d', grant)}
