-- (Included at the top of every script that writes a conversation's turns: lua.py puts it where a script says
-- `--@include included/tree`.) The tree of turns: one hash per conversation (agent:conv:{id}:tree), with per turn T:
--   T:parent  the parent turn's id ('' for a first turn)    T:kids  its children's ids, oldest first, space-separated
--   T:n, T:m:0 .. T:m:{n-1}  its messages (0: its person's message, then what the turn produced)
--   T:s, T:s:0 .. T:s:{s-1}  its steps                      T:v  its version: +1 on every write of the turn
--   T:sum  its summary, once ended                          T:doc  its small fields, as its ending wrote them
--   T:d    its depth (1 for a first turn): meta's `turns`, the turns shown   T:title  a first turn's title
--   T:root the first turn of its path (itself for a first turn): whose title the list shows, read in one step
--   added:{v}  the turn added when the meta's tree_v became v (a switch adds none): read.lua's log of changes
-- A first turn's siblings are the kids of '' (field ':kids'). Its keys are built here from the conversation's
-- key prefix: a standalone Redis (RQ supports no cluster) runs a script whatever keys it touches.

-- The list's row follows the branch shown: its number of turns (the tip's depth) and, unless a person renamed it,
-- its title (the first turn's).
local function show(meta, tree, tip)
  redis.call('HSET', meta, 'tip', tip, 'turns', redis.call('HGET', tree, tip .. ':d') or 0)
  if redis.call('HEXISTS', meta, 'renamed') == 1 then return end
  local first = redis.call('HGET', tree, tip .. ':root')
  if not first then  -- a turn written before turns named their root: walk up
    first = tip
    for _ = 1, 100000 do
      local parent = redis.call('HGET', tree, first .. ':parent')
      if not parent or parent == '' then break end
      first = parent
    end
  end
  local title = redis.call('HGET', tree, first .. ':title')
  if title then redis.call('HSET', meta, 'title', title) end
end

local function kids_add(tree, parent, turn_id)
  local kids = redis.call('HGET', tree, parent .. ':kids')
  redis.call('HSET', tree, parent .. ':kids', (kids and kids ~= '') and (kids .. ' ' .. turn_id) or turn_id)
end

-- A conversation stored in the flat shape (a release before the tree: history, steps and turn summaries as three
-- lists, turns found by position) is moved into the tree the first time anything writes it, in this same script:
-- the history cut at each user message, each piece a turn whose parent is the one before, its summary and steps
-- found by position and turn id, as the flat reader found them. Readers read both shapes (reads.py).
local function migrate(meta, base)
  if redis.call('EXISTS', meta) == 0 or redis.call('HEXISTS', meta, 'shape') == 1 then return end
  local history, steps, turns, tree = base .. 'history', base .. 'steps', base .. 'turns', base .. 'tree'
  local latest = redis.call('HGET', meta, 'turn_id') or ''
  local summaries = redis.call('LRANGE', turns, 0, -1)
  local segments = {}
  for _, raw in ipairs(redis.call('LRANGE', history, 0, -1)) do
    local ok, message = pcall(cjson.decode, raw)
    if #segments == 0 or (ok and type(message) == 'table' and message['role'] == 'user') then
      segments[#segments + 1] = {}
    end
    local segment = segments[#segments]
    segment[#segment + 1] = raw
  end
  local ids, seen = {}, {}
  for i = 1, #segments do
    local id = ''
    if summaries[i] then
      local ok, summary = pcall(cjson.decode, summaries[i])
      if ok and type(summary) == 'table' and type(summary['turn_id']) == 'string' then id = summary['turn_id'] end
    elseif i == #segments then
      id = latest
    end
    if id == '' or seen[id] or string.find(id, '[%s:]') then id = 'flat-' .. i end
    seen[id] = true
    ids[i] = id
  end
  local parent = ''
  for i, segment in ipairs(segments) do
    local id = ids[i]
    redis.call('HSET', tree, id .. ':parent', parent, id .. ':n', #segment, id .. ':s', 0, id .. ':v', 1, id .. ':d', i,
      id .. ':root', ids[1])
    for j, raw in ipairs(segment) do redis.call('HSET', tree, id .. ':m:' .. (j - 1), raw) end
    if summaries[i] then redis.call('HSET', tree, id .. ':sum', summaries[i]) end
    kids_add(tree, parent, id)
    parent = id
  end
  local turn_of = ids[#ids] or ''
  for _, raw in ipairs(redis.call('LRANGE', steps, 0, -1)) do
    local ok, step = pcall(cjson.decode, raw)
    if ok and type(step) == 'table' and type(step['turn_id']) == 'string' and seen[step['turn_id']] then
      turn_of = step['turn_id']
    end
    if turn_of ~= '' then
      local n = redis.call('HINCRBY', tree, turn_of .. ':s', 1)
      redis.call('HSET', tree, turn_of .. ':s:' .. (n - 1), raw)
    end
  end
  local writer = redis.call('HGET', meta, 'owner')  -- the job that writes the turn: `owner`, in that release
  if writer then
    redis.call('HSET', meta, 'writer', writer)
    redis.call('HDEL', meta, 'owner')
  end
  if ids[1] then redis.call('HSET', tree, ids[1] .. ':title', redis.call('HGET', meta, 'title') or '') end
  redis.call('HSET', meta, 'shape', 'tree', 'tip', parent, 'tree_v', 1, 'turns', #ids)
  redis.call('DEL', history, steps, turns)
  local ttl = redis.call('PTTL', meta)
  if ttl > 0 and redis.call('EXISTS', tree) == 1 then redis.call('PEXPIRE', tree, ttl) end
end
