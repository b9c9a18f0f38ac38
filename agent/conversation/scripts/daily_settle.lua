-- A turn's spend settled against its person's day, once, whoever writes its ending.
-- KEYS[1] the person's day, KEYS[2] the turn's settled marker; ARGV[1] minus what was reserved,
-- ARGV[2] what the turn spent (picodollars), ARGV[3] the TTL (seconds). Returns 1, or 0 when settled already.
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[3]) then
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'reserved', ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'spent', ARGV[2])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
return 1
