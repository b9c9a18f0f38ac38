-- The whole tree of a conversation, for `branches` and `show --json` (a read: it writes nothing).
-- KEYS: meta, tree. ARGV: the most bytes of a turn's message to return.
-- Returns {tip, turn in flight ('' for none), turns}: per turn, from the first ones down, each turn's children after
-- it (depth first, oldest first), its id, parent, depth, its person's message (cut), its summary's status ('' while
-- in flight or when it has none); {} for a conversation not of the tree shape (scripts/included/tree.lua) or none.
local meta, tree, cut = KEYS[1], KEYS[2], tonumber(ARGV[1])
local m = redis.call('HMGET', meta, 'shape', 'tip', 'turn_id', 'done')
if not m[1] then return {} end
local out, stack = {}, {}
local function push_kids(parent, depth)
  local kids, list = redis.call('HGET', tree, parent .. ':kids') or '', {}
  for id in string.gmatch(kids, '%S+') do list[#list + 1] = id end
  for i = #list, 1, -1 do stack[#stack + 1] = {list[i], parent, depth} end
end
push_kids('', 0)
while #stack > 0 and #out < 200000 do
  local top = table.remove(stack)
  local rec = redis.call('HMGET', tree, top[1] .. ':m:0', top[1] .. ':sum')
  local status = ''
  if rec[2] then
    local ok, summary = pcall(cjson.decode, rec[2])
    if ok and type(summary) == 'table' and type(summary['status']) == 'string' then status = summary['status'] end
  end
  out[#out + 1] = {top[1], top[2], top[3], string.sub(rec[1] or '', 1, cut), status}
  push_kids(top[1], top[3] + 1)
end
return {m[2] or '', m[4] == '0' and (m[3] or '') or '', out}
