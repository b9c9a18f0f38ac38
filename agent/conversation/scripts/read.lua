-- Read a conversation, in one consistent step (a read: it writes nothing, so Redis runs it at its maxmemory too).
-- KEYS: meta, tree, live, and the flat shape's history, steps, turns (scripts/included/tree.lua)
-- ARGV: tip (the turn whose path to read; '': the one the conversation shows), then, for a reader that holds an
-- earlier read: the tree's version it read, its tip, how many of the tip's messages and steps it has, and the
-- bytes of live text it has.
-- Returns {'none'}; {'flat', meta, live text, history, steps, turns} for a conversation of the flat shape;
-- {'since', meta, live length, live text past the bytes known, tip's version, messages, steps, summary, doc,
-- its new messages, its new steps} when the tree and the tip are the ones the reader read (only what is new);
-- else {'path', meta, live text, path}: per turn from the first to the tip, its id, parent, siblings (ids,
-- space-separated, oldest first), version, number of messages and of steps.
local meta, tree, live = KEYS[1], KEYS[2], KEYS[3]
local fields = redis.call('HGETALL', meta)
if #fields == 0 then return {'none'} end
local m = {}
for i = 1, #fields, 2 do m[fields[i]] = fields[i + 1] end
if not m['shape'] then
  return {'flat', fields, redis.call('GET', live) or '', redis.call('LRANGE', KEYS[4], 0, -1),
          redis.call('LRANGE', KEYS[5], 0, -1), redis.call('LRANGE', KEYS[6], 0, -1)}
end
local tip = ARGV[1] ~= '' and ARGV[1] or (m['tip'] or '')
if ARGV[2] and ARGV[2] == (m['tree_v'] or '') and ARGV[3] == tip then
  local have_n, have_s, have_bytes = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local rec = redis.call('HMGET', tree, tip .. ':v', tip .. ':n', tip .. ':s', tip .. ':sum', tip .. ':doc')
  local n, s = tonumber(rec[2] or '0'), tonumber(rec[3] or '0')
  local messages, steps = {}, {}
  for i = have_n, n - 1 do messages[#messages + 1] = redis.call('HGET', tree, tip .. ':m:' .. i) or '' end
  for i = have_s, s - 1 do steps[#steps + 1] = redis.call('HGET', tree, tip .. ':s:' .. i) or '' end
  return {'since', fields, redis.call('STRLEN', live), redis.call('GETRANGE', live, have_bytes, -1), rec[1] or '0',
          tostring(n), tostring(s), rec[4] or '', rec[5] or '', messages, steps}
end
local path, turn = {}, tip
for _ = 1, 100000 do
  if turn == '' then break end
  local rec = redis.call('HMGET', tree, turn .. ':parent', turn .. ':v', turn .. ':n', turn .. ':s')
  if not rec[1] then break end
  path[#path + 1] = {turn, rec[1], redis.call('HGET', tree, rec[1] .. ':kids') or turn, rec[2] or '0',
                     rec[3] or '0', rec[4] or '0'}
  turn = rec[1]
end
local ordered = {}
for i = #path, 1, -1 do ordered[#ordered + 1] = path[i] end
return {'path', fields, redis.call('GET', live) or '', ordered}
