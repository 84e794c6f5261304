-- Take up to `count` pending tasks of one queue under a lease, each with a new fencing
-- token; a task a route limit holds back is set aside (held, or scheduled for its rate)
-- instead, and a suspect after the first goes back to the head of the queue. A bytes
-- payload is kept in field 'bin', where a worker that predates them finds no payload and
-- fails the task instead of misreading it.
-- A record it cannot read costs only itself: a popped id whose key holds no hash, and a
-- priority in `levels` that is not 1 to 9, are set aside (set_aside) and named in the
-- reply; the read of each task is protected (pcall), which costs no more Redis calls.
-- A task past its expiry ('exp') is not started: it ends dead, expired (expire), and is
-- named in the reply for its worker to count.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- The pop comes first, so a Redis at maxmemory lets the script finish.
local aside = {}
if redis.call('EXISTS', KEYS[@k_paused]) == 1 then
  return {[@r_now] = 0, [@r_dropped] = 0, [@r_count] = 0, [@r_ahead] = '', [@r_aside] = aside,
          [@r_expired] = {}}
end
local now = now_ms()

-- The rank of a task of priority `p` due since `due` (ms, as the hash keeps it).
local function rank(due, p)
  return (tonumber(due) or now) - p * tonumber(ARGV[@aging])
end

local function said_aside(name, why)
  aside[#aside + 1] = {[@r_aside_name] = name, [@r_aside_why] = why}
end

-- With tasks of priorities other than 0 (their levels named in `levels`): up to `count`
-- ids, the best ranked first, and the rank of the best task left (nil: none). A task of priority p pending
-- for w ms ranks as p + w / aging_ms, so a lower priority is never starved: it ages into
-- the higher ones. Ranks compare as due - p * aging_ms (the lower first; equal: the higher
-- priority). The oldest task (the head) of each list is ranked, and the best list is taken
-- in its own order down to the second best's head: its tasks pending since later rank
-- lower, so a run ends at the first whose rank passes that head's (found by halving the
-- run, from the most still wanted).
local function by_rank(levels, count, floor)
  local function ranked(id, p)  -- a key holding no hash ranks as due now: the pop sets it aside
    return rank(redis.pcall('HGET', task_key(id), 'due'), p)
  end
  local function head(list, p)
    local read, id = pcall(redis.call, 'LINDEX', list, -1)
    if not read then
      local name = string.sub(list, #prefix + 1)
      said_aside(@key_aside .. name, key_aside(name, 'list', now))
    elseif id then
      return {list, p, ranked(id, p)}
    end
  end
  local function before(a, b)
    return a[3] < b[3] or (a[3] == b[3] and a[2] > b[2])
  end
  local entries = {head(KEYS[@k_pending], 0)}
  for _, level in ipairs(levels) do
    if string.match(level, '^[1-9]$') then
      local entry = head(KEYS[@k_pending] .. ':' .. level, tonumber(level))
      if entry then
        entries[#entries + 1] = entry
      else
        redis.call('SREM', prefix .. @key_levels, level)
      end
    else
      said_aside(level_aside(level, now))
    end
  end
  if floor then  -- a list of no tasks, ranked at the floor: the run ends on reaching it
    entries[#entries + 1] = {false, -1, floor}
  end
  table.sort(entries, before)
  local ids = {}
  while #ids < count and entries[1] and entries[1][1] do
    local e, take = entries[1], count - #ids
    local second = entries[2]
    while second and take > 1 do
      local id = redis.call('LINDEX', e[1], -take)
      if id and before({e[1], e[2], ranked(id, e[2])}, second) then
        break
      end
      take = math.floor(take / 2)
    end
    for _, id in ipairs(redis.call('RPOP', e[1], take)) do
      ids[#ids + 1] = id
    end
    local after = head(e[1], e[2])
    table.remove(entries, 1)
    if after then
      local at = 1
      while entries[at] and before(entries[at], after) do
        at = at + 1
      end
      table.insert(entries, at, after)
    elseif e[2] > 0 then
      redis.call('SREM', prefix .. @key_levels, int_text(e[2]))
    end
  end
  for _, e in ipairs(entries) do
    if e[1] then
      return #ids > 0 and ids, e[3]
    end
  end
  return #ids > 0 and ids, nil
end

-- A key of the queue's own that holds another type (written outside obsq) is set aside
-- (key_aside) where it is first read, before a task is popped or where a write after the pop
-- would fail, so that it stops neither the fetch nor loses the tasks popped.
local read, levels = pcall(redis.call, 'SMEMBERS', prefix .. @key_levels)
if not read then  -- named again from the lists of priority that hold tasks
  said_aside(@key_aside .. @key_levels, key_aside(@key_levels, 'set', now))
  levels = {}
  for p = 1, 9 do
    if redis.call('EXISTS', KEYS[@k_pending] .. ':' .. p) == 1 then
      levels[#levels + 1] = tostring(p)
    end
  end
  call_sliced('SADD', prefix .. @key_levels, levels)
end
local floor = tonumber(ARGV[@floor])

-- Up to `n` tasks of the plain pending lists (false: none), and the rank of the best left;
-- `n` may be ARGV's text, which RPOP takes as it is.
local function plain(n)
  if #levels == 0 and not floor then
    local popped, ids = pcall(redis.call, 'RPOP', KEYS[@k_pending], n)
    if popped then
      return ids, nil
    end
    said_aside(@key_aside .. @key_pending, key_aside(@key_pending, 'list', now))
    return false, nil
  end
  return by_rank(levels, tonumber(n), floor)
end

-- With tasks waiting under fairness keys (_prelude.lua: push_fair): the keys of the ring
-- take turns, each giving its best task (or as many as its weight), '' standing for the
-- plain lists, so one key's backlog delays another key's task by one turn at most. Up to
-- `n` ids and the rank of the best plain task left. A key left with no task leaves the
-- ring, and the ring goes when only '' is left: the plain lists alone again.
local ring = prefix .. @key_fair_ring
local function by_turns(n, weights)
  local ids, left, idle, keyed = {}, nil, 0, 0
  local function add(got)
    for _, id in ipairs(got or {}) do
      ids[#ids + 1] = id
    end
    idle = (got and #got > 0) and 0 or idle + 1
  end
  while #ids < n and idle < 2 do  -- two empty turns in a row: '' and a key emptied by hand
    local key = redis.call('LMOVE', ring, ring, 'RIGHT', 'LEFT')
    if not key then
      break
    end
    local take = math.min(weights and tonumber(weights[key]) or 1, n - #ids)
    local shrunk = false
    if key == '' then
      local got
      got, left = plain(take)
      add(got)
    else
      local got, emptied = pop_keyed(key, take)
      keyed = keyed + #got
      if emptied then
        redis.call('LPOP', ring)  -- the key LMOVE just put at the left
        shrunk = true
      end
      add(got)
    end
    if shrunk or idle > 0 then
      local size = redis.call('LLEN', ring)
      if size == 0 or (size == 1 and redis.call('LINDEX', ring, 0) == '') then
        redis.call('DEL', ring)
        if #ids < n then
          local got
          got, left = plain(n - #ids)
          add(got)
        end
        break
      end
    end
  end
  if keyed > 0 then
    redis.call('DECRBY', prefix .. @key_fair_count, keyed)
  end
  return #ids > 0 and ids, left
end

local ids, left
local ring_kind = redis.call('TYPE', ring).ok
if ring_kind ~= 'list' and ring_kind ~= 'none' then  -- made again from the keys waiting
  said_aside(@key_aside .. @key_fair_ring, key_aside(@key_fair_ring, 'list', now))
  local keys = redis.call('ZRANGE', prefix .. @key_fair_waiting, 0, -1)
  ring_kind = 'none'
  if #keys > 0 then
    redis.call('LPUSH', ring, '')
    call_sliced('LPUSH', ring, keys)
    ring_kind = 'list'
  end
end
if ring_kind == 'list' then
  ids, left = by_turns(tonumber(ARGV[@count]),
                       ARGV[@weights] ~= '' and cjson.decode(ARGV[@weights]) or nil)
else
  ids, left = plain(ARGV[@count])
end
if not ids and left then  -- none ranks before the floor: the tasks wait for their turn
  return {[@r_now] = now, [@r_dropped] = 0, [@r_count] = 0, [@r_ahead] = int_text(left),
          [@r_aside] = aside, [@r_expired] = {}}
end
if not ids then
  redis.call('DEL', KEYS[@k_wake])
  return {[@r_now] = now, [@r_dropped] = 0, [@r_count] = 0, [@r_ahead] = '', [@r_aside] = aside,
          [@r_expired] = {}}
end
local limits = ARGV[@limits] ~= '' and cjson.decode(ARGV[@limits]) or nil

-- The entry of `entries` for a type: exact, else the longest prefix, else '*'.
local function best(entries, task_type)
  local found, rank = nil, -1
  for _, entry in ipairs(entries) do
    local pattern = entry[1]
    if covers(pattern, task_type) then
      local r = pattern == task_type and 1e9 or (pattern == '*' and 0 or #pattern)
      if r > rank then
        found, rank = entry, r
      end
    end
  end
  return found
end

-- Whether a start of a route's (or one of its fairness key's) tasks now keeps within its
-- rate: each start takes `interval` ms from a clock kept in `rate:<slot>` that may run ahead
-- of now by `tolerance` ms; a start beyond that is reserved for later: the time, else nil.
local function reserved_start(slot, interval, tolerance)
  local rate_key = prefix .. @key_rate .. slot
  local free = math.max(tonumber(redis.call('GET', rate_key)) or now, now)
  redis.call('SET', rate_key, free + interval, 'PX', math.ceil(free + interval - now) + 60000)
  if free - now > tolerance then
    return free
  end
end

-- Why task `id` (`f`: its hash's fields, as read below) may not start now ('concurrency'
-- or 'rate'), after setting it aside; else nil, and the route slot it takes ('' for none).
-- A route with limits per fairness key (route[5]: concurrency, route[6], route[7]: rate
-- interval and tolerance) counts a keyed task also in its key's slot, "<route>\n<key>"
-- (no name holds a newline): its slot is then that one (release_limits).
local function limited(id, f)
  local task_type, reserved = f[1], tonumber(f[10])
  local mine, route = best(limits.l, task_type), best(limits.g, task_type)
  local key_slot = route and f[16] and ((route[5] or 0) > 0 or (route[6] or 0) > 0) and
      route[1] .. '\n' .. f[16]
  local held_for = mine and mine[2] <= 0 and mine[1]
  if not held_for and route and route[2] > 0 and
      redis.call('SCARD', prefix .. @key_running .. route[1]) >= route[2] then
    held_for = route[1]
  end
  if not held_for and key_slot and route[5] > 0 and
      redis.call('SCARD', prefix .. @key_running .. key_slot) >= route[5] then
    held_for = key_slot
  end
  if held_for then
    local p = f[14] and string.match(f[14], '^[1-9]$')  -- as level_list reads it
    hold_back(id, held_for, rank(f[6], tonumber(p) or 0), f[11])
    return 'concurrency'
  end
  if not (reserved and reserved <= now) then
    -- the key's rate first: a start it reserves for later takes nothing of the route's
    local later = key_slot and route[6] > 0 and reserved_start(key_slot, route[6], route[7])
    if not later and route and route[3] > 0 then
      later = reserved_start(route[1], route[3], route[4])
    end
    if later then
      redis.call('HSET', task_key(id), 'state', 'scheduled', 'rsv', later)
      redis.call('ZADD', prefix .. @key_scheduled, later, id)
      return 'rate'
    end
  end
  if mine then
    mine[2] = mine[2] - 1
  end
  local slot = ''
  if route and route[2] > 0 then
    redis.call('SADD', prefix .. @key_running .. route[1], id)
    slot = route[1]
  end
  if key_slot and route[5] > 0 then
    redis.call('SADD', prefix .. @key_running .. key_slot, id)
    slot = key_slot
  end
  if slot ~= '' then
    redis.call('HSET', task_key(id), 'slot', slot)
  end
  return nil, slot
end

local counted, fence = pcall(redis.call, 'INCRBY', KEYS[@k_fence], #ids)
if not counted then  -- fences go on from the clock's ms: above any handed out before
  said_aside(@key_aside .. @key_fence, key_aside(@key_fence, 'counter', now))
  fence = redis.call('INCRBY', KEYS[@k_fence], now + #ids)
end
fence = fence - #ids
local expires = int_text(now + tonumber(ARGV[@lease]))
local leases, owners, tasks, held = {}, {}, {}, {}
local dropped, suspects, returned = 0, 0, 0
local expired = {}
for _, id in ipairs(ids) do
  local f = redis.pcall('HMGET', task_key(id), 'type', 'payload', 'headers', 'opts', 'retried',
                        'due', 'own', 'ordk', 'ow', 'rsv', 'hc', 'bin', 'sus', 'pri', 'exp',
                        'fk')
  local why, slot = nil, ''
  if f.err then  -- its key holds no hash
    why = task_aside(id, @key_pending, now)
    said_aside(@key_task .. id, why)
  elseif not f[1] then
    dropped = dropped + 1  -- its hash was deleted behind obsq's back: nothing left to run
    why = 'gone'
  elseif f[15] and (tonumber(f[15]) or math.huge) <= now then
    why = 'expired'
    expire(id, 'not started by its expiry', now)
    expired[#expired + 1] = {[@r_expired_id] = id, [@r_expired_type] = f[1],
                             [@r_expired_retried] = f[5] or '',
                             [@r_expired_headers] = f[3] or '',
                             [@r_expired_priority] = f[14] or ''}
  elseif f[13] and suspects > 0 then
    -- one suspect per fetch: its worker runs it alone, so the others go back to the head of
    -- the queue for other workers instead of waiting their turn in this one
    why = 'returned'
    push_pending(KEYS[@k_pending], id, true, f[14] or false, f[16])
    returned = returned + 1
  elseif limits then
    why, slot = limited(id, f)
    if why and not (why == 'concurrency' and f[11]) then
      -- counted once per hold: a task the forwarder let out to look again is not new
      local h = #held
      held[h + @rt_type] = f[1]
      held[h + @rt_why] = why
    end
  end
  if not why then
    if f[13] then
      suspects = suspects + 1
    end
    fence = fence + 1
    leases[#leases + 1] = expires
    leases[#leases + 1] = id
    owners[#owners + 1] = id
    owners[#owners + 1] = int_text(fence) .. ':' .. ARGV[@worker]
    local t = #tasks
    tasks[t + @r_id] = id
    tasks[t + @r_fence] = fence
    tasks[t + @r_type] = f[1]
    tasks[t + @r_payload] = f[12] or f[2] or ''
    tasks[t + @r_headers] = f[3] or ''
    tasks[t + @r_options] = f[4] or ''
    tasks[t + @r_retried] = f[5] or ''
    tasks[t + @r_due_ms] = f[6] or ''
    tasks[t + @r_id_chosen] = f[7] or ''
    tasks[t + @r_ordering_key] = f[8] or ''
    tasks[t + @r_waited] = f[9] or ''
    tasks[t + @r_slot] = slot
    tasks[t + @r_binary] = f[12] and '1' or ''
    tasks[t + @r_suspect] = f[13] and '1' or ''
    tasks[t + @r_priority] = f[14] or ''
    if f[9] or f[10] or f[11] then
      redis.call('HDEL', task_key(id), 'ow', 'rsv', 'hc')  -- counted and used once
    end
  end
end
if not pcall(call_sliced, 'ZADD', KEYS[@k_lease], leases) then
  said_aside(@key_aside .. @key_lease, key_aside(@key_lease, 'zset', now))
  call_sliced('ZADD', KEYS[@k_lease], leases)
end
if not pcall(call_sliced, 'HSET', KEYS[@k_active], owners) then
  said_aside(@key_aside .. @key_active, key_aside(@key_active, 'hash', now))
  call_sliced('HSET', KEYS[@k_active], owners)
end
if not left and redis.call('LLEN', KEYS[@k_pending]) == 0 and
    redis.call('EXISTS', ring) == 0 then
  redis.call('DEL', KEYS[@k_wake])
end
if returned > 0 then
  wake(KEYS[@k_wake], returned)
end
local out = {}
out[@r_now] = now
out[@r_dropped] = dropped
out[@r_count] = #tasks / @r_stride
out[@r_ahead] = ''
out[@r_aside] = aside
out[@r_expired] = expired
if ARGV[@ahead] == '1' then
  if left then
    out[@r_ahead] = int_text(left)
  elseif #levels == 0 then
    local id = redis.call('LINDEX', KEYS[@k_pending], -1)
    if id then
      out[@r_ahead] = int_text(tonumber(redis.pcall('HGET', task_key(id), 'due')) or now)
    end
  end
  if out[@r_ahead] == '' and redis.call('EXISTS', ring) == 1 then
    out[@r_ahead] = int_text(now)  -- keyed tasks wait: ranked as due now
  end
end
for _, v in ipairs(tasks) do
  out[#out + 1] = v
end
for _, v in ipairs(held) do
  out[#out + 1] = v
end
return out
