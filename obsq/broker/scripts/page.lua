-- One page of the tasks of a queue in one state, for the Inspector. Bounded whatever the
-- size of the state: it reads a window by rank (LRANGE/ZRANGE) and looks at no more than
-- `cap` ids, so a page of a queue of millions costs what a page of ten does. By `order`:
-- 'list', oldest first from the right end of each list of pending tasks, the highest
-- priority first, then the held tasks of each route pattern in the order they would be let
-- out, then the tasks waiting behind their ordering key by when they were enqueued, then
-- those waiting under a fairness key, key by key (the keys with most first); 'head',
-- oldest first from the left end of a group; 'asc' or 'desc' by score.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local order, offset, limit, want, cap = ARGV[@order], tonumber(ARGV[@offset]), tonumber(ARGV[@limit]),
    ARGV[@pattern], tonumber(ARGV[@cap])
local source = KEYS[@k_group] or KEYS[@k_by_state]
-- pending is read as one list made of the lists of priorities above 0, highest first, the
-- pending list, the sorted sets of the tasks held back by a route limit, each best first,
-- an earlier version's lists of them, each oldest first, and last the sorted set of those
-- waiting behind their ordering key (they count as pending); `sorted` names the sets, and
-- `members` those of held tasks, whose members are not bare ids
local segments, lengths, sorted, members = {source}, {}, {}, {}
local waiting = prefix .. @key_ordering_waiting
if order == 'list' then
  segments = level_lists(source)
  segments[#segments + 1] = source
  local ranked, unranked = held_keys()
  for _, held in ipairs(ranked) do
    segments[#segments + 1] = held
    sorted[held], members[held] = true, true
  end
  for _, held in ipairs(unranked) do
    segments[#segments + 1] = held
  end
  segments[#segments + 1] = waiting
  sorted[waiting] = true
  -- then the sets of the fairness keys with most waiting tasks, each in the order its tasks
  -- start: their lengths read from `fairkeys`, and no more of them than a page looks at
  -- tasks (the others are counted in the depth, not listed)
  local keyed = redis.call('ZREVRANGE', prefix .. @key_fair_waiting, 0, cap - 1, 'WITHSCORES')
  for i = 1, #keyed, 2 do
    local set = prefix .. @key_fair .. keyed[i]
    segments[#segments + 1] = set
    sorted[set] = true
    lengths[#segments] = tonumber(keyed[i + 1])
  end
end
local total = 0
if order == 'list' or order == 'head' then
  for i, key in ipairs(segments) do
    lengths[i] = lengths[i] or (sorted[key] and redis.call('ZCARD', key) or
                                redis.call('LLEN', key))
    total = total + lengths[i]
  end
else
  total = redis.call('ZCARD', source)
end
local function matches(task_type)
  return want == '' or (task_type and covers(want, task_type))
end

local function window(start, n)
  local ids, scores = {}, {}
  if order == 'head' then
    ids = redis.call('LRANGE', source, start, start + n - 1)
    for i = 1, #ids do
      scores[i] = ''
    end
    return ids, scores
  end
  if order == 'list' then
    local skip = start
    for s, key in ipairs(segments) do
      if #ids >= n then
        break
      end
      if skip >= lengths[s] then
        skip = skip - lengths[s]
      else
        local take = math.min(n - #ids, lengths[s] - skip)
        if sorted[key] then
          for _, member in ipairs(redis.call('ZRANGE', key, skip, skip + take - 1)) do
            ids[#ids + 1] = members[key] and held_id(member) or member
            scores[#scores + 1] = ''
          end
        else
          local raw = redis.call('LRANGE', key, -(skip + take), -(skip + 1))
          for i = #raw, 1, -1 do
            ids[#ids + 1] = raw[i]
            scores[#scores + 1] = ''
          end
        end
        skip = 0
      end
    end
    return ids, scores
  end
  local raw  -- each command named literally: `obsq acl` reads them from the source
  if order == 'asc' then
    raw = redis.call('ZRANGE', source, start, start + n - 1, 'WITHSCORES')
  else
    raw = redis.call('ZREVRANGE', source, start, start + n - 1, 'WITHSCORES')
  end
  for i = 1, #raw, 2 do
    ids[#ids + 1] = raw[i]
    scores[#scores + 1] = raw[i + 1]
  end
  return ids, scores
end

local out = {[@r_total] = total, [@r_next_offset] = -1}
local active = prefix .. @key_active
local pos, found, scanned = offset, 0, 0
local chunk = want == '' and limit or 200
while found < limit and pos < total and scanned < cap do
  local ids, scores = window(pos, math.min(chunk, cap - scanned))
  if #ids == 0 then
    break
  end
  for i, id in ipairs(ids) do
    pos = pos + 1
    scanned = scanned + 1
    local f = redis.call('HMGET', task_key(id), 'type', 'retried', 'enq', 'due', 'done', 'error',
                         'payload', 'bin', 'pri')
    if matches(f[1]) then
      found = found + 1
      local owner = redis.call('HGET', active, id) or ''
      local o = #out
      out[o + @r_id] = id
      out[o + @r_score] = scores[i]
      out[o + @r_type] = f[1] or ''
      out[o + @r_retried] = f[2] or ''
      out[o + @r_enqueued] = f[3] or ''
      out[o + @r_due] = f[4] or ''
      out[o + @r_done] = f[5] or ''
      out[o + @r_error] = string.sub(f[6] or '', 1, 300)
      out[o + @r_payload] = string.sub(f[8] or f[7] or '', 1, 300)
      out[o + @r_owner] = owner
      out[o + @r_size] = f[8] and #f[8] or ''
      out[o + @r_priority] = f[9] or ''
      if found == limit then
        break
      end
    end
  end
end
if pos < total then
  out[@r_next_offset] = pos
end
return out
