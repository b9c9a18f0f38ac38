-- Begin a turn: a new turn in the conversation's tree (scripts/included/tree.lua), its person's message its first, shown
-- (the conversation's tip) and queued; one turn at a time. Its parent is the turn shown, or (`branch_of`: a
-- regenerate or an edit of turn B) B's parent: a branch copies nothing but the one message.
-- KEYS: meta, tree, events, index, live, the memory reservations of the turns in flight; for a signed-in person,
-- also their conversations (the person's index) and their turns in flight
-- ARGV: turn_id, message, doc, ttl, conversation_id, updated_at, title, must_exist ('1' or '0'), max_bytes (0: no cap),
-- writer (the id of the job that will run the turn), person (the signed-in person's id; '' for the local playground
-- and the operator), the most turns the person may have in flight (0: no cap), the bytes a turn reserves for its
-- final write, the bytes left for reservations (-1: no limit), when this reservation lapses (epoch s), the key
-- prefix of the conversation, branch_of ('' for none: the turn continues the one shown), then the members of the
-- person's turns in flight that have ended since (the caller looked: a turn that ended never comes back)
-- Returns {outcome, value}, and writes nothing unless the outcome is 'ok' (value: the version) but the move of a
-- conversation of the flat shape into the tree, which changes nothing it means:
-- 'same' (this turn began already: a double submit, also one of a turn that has ended since), 'busy' (value: the
-- turn in flight), 'full' (value: the conversation's bytes), 'gone' (must_exist, and it expired or was deleted),
-- 'unreadable' (a version not a number),
-- 'theirs' (it belongs to someone else, or to nobody signed in: told as not found), 'many' (value: the cap),
-- 'room' (value: the turns holding a reservation; this one's would not fit beside theirs), 'no turn' (branch_of is
-- no turn of the conversation).
--@include included/tree
local meta, tree, events, index, live = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local turn_id, message, doc, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local conversation_id, updated_at, title = ARGV[5], ARGV[6], ARGV[7]
local must_exist, max_bytes, writer = ARGV[8] == '1', tonumber(ARGV[9]), ARGV[10]
local person, max_turns = ARGV[11], tonumber(ARGV[12])
local reserved, reserve_bytes, reserve_room, reserve_until = KEYS[6], tonumber(ARGV[13]), tonumber(ARGV[14]), ARGV[15]
local base, branch_of = ARGV[16], ARGV[17]
local person_index, person_turns = KEYS[7], KEYS[8]
local current = redis.call('HMGET', meta, 'turn_id', 'done', 'version', 'bytes', 'owned_by')
if person ~= '' and redis.call('EXISTS', meta) == 1 and current[5] ~= person then return {'theirs', ''} end
-- A version that is not a whole number would fail HINCRBY below, after the message was appended.
if current[3] and not string.match(current[3], '^%d+$') then return {'unreadable', ''} end
if current[1] then
  if current[1] == turn_id then return {'same', current[3]} end
  if current[2] == '0' then return {'busy', current[1]} end
  if max_bytes > 0 and tonumber(current[4] or '0') >= max_bytes then return {'full', current[4]} end
elseif must_exist or branch_of ~= '' then
  return {'gone', ''}
end
if reserve_room >= 0 then
  local holding = redis.call('ZCOUNT', reserved, '(' .. updated_at, '+inf')
  if (holding + 1) * reserve_bytes > reserve_room then return {'room', tostring(holding)} end
end
migrate(meta, base)
-- A turn of the tree begun again (a send submitted twice, the first long since answered, or another branch's turn
-- id): it began already, and its record is left as it is.
if redis.call('HEXISTS', tree, turn_id .. ':parent') == 1 then return {'same', current[3] or '0'} end
local parent = redis.call('HGET', meta, 'tip') or ''
if branch_of ~= '' then
  parent = redis.call('HGET', tree, branch_of .. ':parent')
  if not parent then return {'no turn', branch_of} end
end
if person ~= '' then
  local ended = {}
  for i = 18, #ARGV do ended[#ended + 1] = ARGV[i] end
  local in_flight = redis.call('ZCARD', person_turns)
  for _, member in ipairs(ended) do
    if redis.call('ZSCORE', person_turns, member) then in_flight = in_flight - 1 end
  end
  if max_turns > 0 and in_flight >= max_turns then return {'many', tostring(max_turns)} end
  redis.call('ZADD', person_turns, updated_at, conversation_id .. ' ' .. turn_id)  -- the first write
  for _, member in ipairs(ended) do redis.call('ZREM', person_turns, member) end
  redis.call('EXPIRE', person_turns, ttl)
  redis.call('HSETNX', meta, 'owned_by', person)
  redis.call('ZADD', person_index, updated_at, conversation_id)
end
local depth, root = 1, turn_id
if parent ~= '' then
  local above = redis.call('HMGET', tree, parent .. ':d', parent .. ':root')
  depth = tonumber(above[1] or '0') + 1
  root = above[2]
end
redis.call('HSET', tree, turn_id .. ':parent', parent, turn_id .. ':n', 1, turn_id .. ':m:0', message,
  turn_id .. ':s', 0, turn_id .. ':v', 1, turn_id .. ':d', depth)
if root then redis.call('HSET', tree, turn_id .. ':root', root) end  -- (none: its parent predates roots; show walks)
if parent == '' then redis.call('HSET', tree, turn_id .. ':title', title) end
kids_add(tree, parent, turn_id)
local version = redis.call('HINCRBY', meta, 'version', 1)
redis.call('HSET', meta, 'turn_id', turn_id, 'done', '0', 'doc', doc, 'writer', writer, 'attempt', '0',
  'shape', 'tree')
show(meta, tree, turn_id)
-- The tree's log of added turns (added:{tree_v}): a reader that holds the path of an earlier tree_v learns which
-- turns' siblings changed since from it alone (read.lua).
redis.call('HSET', tree, 'added:' .. redis.call('HINCRBY', meta, 'tree_v', 1), turn_id)
redis.call('HDEL', meta, 'live', 'live_seq', 'live_ended')
redis.call('DEL', live)
redis.call('HINCRBY', meta, 'bytes', #message)
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
for _, key in ipairs({meta, tree, events}) do redis.call('EXPIRE', key, ttl) end
redis.call('ZADD', index, updated_at, conversation_id)
redis.call('ZREMRANGEBYSCORE', reserved, '-inf', updated_at)  -- reservations that lapsed unreleased
redis.call('ZADD', reserved, reserve_until, conversation_id .. ' ' .. turn_id)
return {'ok', tostring(version)}
