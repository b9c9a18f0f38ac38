-- Read a conversation, in one consistent step (a read: it writes nothing, so Redis runs it at its maxmemory too).
-- KEYS: meta, tree, live, and the flat shape's history, steps, turns (scripts/included/tree.lua)
-- ARGV: tip (the turn whose path to read; '': the one the conversation shows), then, for a reader that holds an
-- earlier read: the tree's version it read, its tip, how many of the tip's messages and steps it has, the bytes of
-- live text it has, and '1' when it also holds that read's path (each turn's id, parent, siblings and counts).
-- Returns {'none'}; {'flat', meta, live text, history, steps, turns} for a conversation of the flat shape;
-- {'since', meta, live length, live text past the bytes known, tip's version, messages, steps, summary, doc,
-- its new messages, its new steps} when the tree and the tip are the ones the reader read (only what is new);
-- {'fork', meta, live text, kept, rows, changes} for a reader that holds the path of a tree version at most MAX_LOG
-- versions old: the first `kept` turns of its path are still the path's; `rows` are the path's turns after them, as
-- in 'path' (the fork's own turn included: it may have changed since); `changes`, per turn added since (the log
-- added:{v}), its parent and that parent's children now (the siblings of the kept turn below it, if any);
-- else {'path', meta, live text, path}: per turn from the first to the tip, its id, parent, siblings (ids,
-- space-separated, oldest first), version, number of messages and of steps.
local MAX_LOG = 64
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
local function row(turn, rec)
  return {turn, rec[1], redis.call('HGET', tree, rec[1] .. ':kids') or turn, rec[2] or '0', rec[3] or '0', rec[4] or '0'}
end
local function record(turn)
  return redis.call('HMGET', tree, turn .. ':parent', turn .. ':v', turn .. ':n', turn .. ':s', turn .. ':d')
end

-- From the tip up to the turn where its path meets the reader's (the deepest turn both share), and that turn: the
-- rows the reader lacks. nil when the tree does not say (a turn without its depth): the whole path is read.
local function fork(a, b)
  local ra, rb = record(a), record(b)
  local da, db = tonumber(ra[5] or ''), tonumber(rb[5] or '')
  if not (ra[1] and rb[1] and da and db) then return nil end
  local below = {}
  for _ = 1, 200000 do
    if a == b then
      below[#below + 1] = row(b, rb)
      return below, db - 1
    end
    if db >= da then
      below[#below + 1] = row(b, rb)
      b = rb[1]
      if b == '' then return (da == 1 or da == 0) and below or nil, 0 end
      rb = record(b)
      db = tonumber(rb[5] or '')
      if not (rb[1] and db) then return nil end
    end
    if da > db then
      a = ra[1]
      if a == '' then return nil end
      ra = record(a)
      da = tonumber(ra[5] or '')
      if not (ra[1] and da) then return nil end
    end
  end
  return nil
end

if ARGV[7] == '1' and m['tree_v'] then
  local from, now = tonumber(ARGV[2]), tonumber(m['tree_v'])
  if from and now and now >= from and now - from <= MAX_LOG and ARGV[3] ~= '' and tip ~= '' then
    local below, kept = fork(ARGV[3], tip)
    if below then
      local rows, changes = {}, {}
      for i = #below, 1, -1 do rows[#rows + 1] = below[i] end
      for v = from + 1, now do
        local added = redis.call('HGET', tree, 'added:' .. v)
        local parent = added and redis.call('HGET', tree, added .. ':parent')
        if parent then changes[#changes + 1] = {parent, redis.call('HGET', tree, parent .. ':kids') or added} end
      end
      return {'fork', fields, redis.call('GET', live) or '', tostring(kept), rows, changes}
    end
  end
end

local path, turn = {}, tip
for _ = 1, 100000 do
  if turn == '' then break end
  local rec = record(turn)
  if not rec[1] then break end
  path[#path + 1] = row(turn, rec)
  turn = rec[1]
end
local ordered = {}
for i = #path, 1, -1 do ordered[#ordered + 1] = path[i] end
return {'path', fields, redis.call('GET', live) or '', ordered}
