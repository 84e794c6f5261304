-- Prepended after _prelude.lua: what route limits and ordering keys keep in a queue's slot.
--   running:<pattern>  set of the ids running under a route's concurrency limit
--   hold:<pattern>     sorted set of the tasks held back by a limit of that route, ranked
--                      as pending tasks are (hold_back), and `holds`, the set of patterns
--                      with such a set; `holdseq`, the counter their places are drawn from
--   held:<pattern>     list of ids (oldest at the right) held by a version before holds were
--                      ranked, which may run beside this one during an upgrade, and
--                      `holding`, the set of their patterns: read as held tasks, and let out
--                      by the forwarder to be held anew (let_out_unranked)
--   rate:<pattern>     the route's next free start time (ms), for its rate limit
--   ord:<key>          list of the ids sharing an ordering key, in enqueue order: only the
--                      first is ever pending, scheduled, running or retrying
--   ordwait            sorted set of the ids waiting behind the first of their key, in
--                      enqueue order (queue_behind): the pending pages list them
--   waiting            how many tasks of the queue are held or wait for their key (they
--                      count as pending)
-- The task hash keeps `held` (the pattern it is held for), `slot` (the pattern whose
-- running set holds it), `ordk` (its ordering key), `ow` (it waited for that key) and `hc`
-- (its place among the held, taken when it is first held, when its hold is counted as a
-- throttled start; cleared when it starts, so that a task the forwarder lets out to look
-- again keeps its place and is not counted twice).

-- Whether route `pattern` (a type, a prefix ending in ':' or '.', or '*') covers a type.
local function covers(pattern, task_type)
  if pattern == '*' or pattern == task_type then
    return true
  end
  local last = string.sub(pattern, -1)
  return (last == ':' or last == '.') and string.sub(task_type, 1, #pattern) == pattern
end

-- A held task's member of its sorted set: its place, then its id, so that tasks of the
-- same rank leave in the order they were first held; held_id reads the id back.
local function held_member(place, id)
  return string.format('%016d:', tonumber(place)) .. id
end

local function held_id(member)
  return string.sub(member, 18)
end

-- Park task `id` until a task of `pattern` stops running (or the forwarder lets one out),
-- ranked as a pending task: `rank` is due - priority * aging (dequeue.lua), the lowest
-- leaving first, so that a low priority held long passes the higher ones held later. Its
-- place: the one it took when first held (`place`), else the next.
local function hold_back(id, pattern, rank, place)
  if place then
    redis.call('HSET', task_key(id), 'held', pattern)
  else
    place = int_text(redis.call('INCR', prefix .. @key_held_places))
    redis.call('HSET', task_key(id), 'held', pattern, 'hc', place)
  end
  redis.call('ZADD', prefix .. @key_held .. pattern, rank, held_member(place, id))
  redis.call('SADD', prefix .. @key_holding, pattern)
  redis.call('INCR', prefix .. @key_waiting)
end

-- Task `id`, taken out of its hold, no longer waits (`waiting`) and goes back to the head of
-- pending, in the list of its priority, for the next fetch to check its limit anew;
-- `place`: one to give it (an earlier version's hold gave it none). Behind the head,
-- though, when that ranks before it: a task let out before it and not taken yet (an
-- attempt's end and a forwarder's pass may each let one out before a fetch). False when
-- there is nothing to run: its hash deleted by hand, or cancelled by an earlier version
-- (which counted it out of `waiting` itself, and leaves it in its sorted set); then also
-- why, when its key holds no hash: it is set aside (task_aside).
local function let_out(id, place)
  local key = task_key(id)
  local f = redis.pcall('HMGET', key, 'state', 'pri', 'due', 'hc', 'fk')
  if f.err then
    redis.call('DECR', prefix .. @key_waiting)
    return false, task_aside(id, @key_held, now_ms())
  end
  if f[1] == 'cancelled' then
    return false
  end
  redis.call('DECR', prefix .. @key_waiting)
  if not f[1] then
    return false
  end
  if place then
    redis.call('HSET', key, 'hc', place)
  end
  redis.call('HDEL', key, 'held')
  place = tonumber(place or f[4]) or 0
  local pending = prefix .. @key_pending
  if f[5] then  -- at the head of its fairness key's tasks
    push_pending(pending, id, true, f[2] or false, f[5])
    return true
  end
  local list = level_list(pending, f[2])
  local head = redis.call('LINDEX', list, -1)
  if head then
    local h = redis.call('HMGET', task_key(head), 'due', 'hc')
    local head_due, due = tonumber(h[1]) or 0, tonumber(f[3]) or 0
    if head_due < due or (head_due == due and h[2] and tonumber(h[2]) < place) then
      redis.call('RPOP', list)
      push_pending(pending, id, true, f[2] or false)
      redis.call('RPUSH', list, head)
      return true
    end
  end
  push_pending(pending, id, true, f[2] or false)
  return true
end

-- The best task held for `pattern` (the lowest rank, then the first held) is let out;
-- `said(id, why)`, when given, is told of each one set aside on the way.
local function unhold(pattern, said)
  local held = prefix .. @key_held .. pattern
  local best, out, why
  repeat
    best = redis.call('ZPOPMIN', held)[1]
    if best then
      out, why = let_out(held_id(best))
      if why and said then
        said(held_id(best), why)
      end
    end
  until not best or out
  if best then
    wake(prefix .. @key_wake, 1)
  end
  if redis.call('EXISTS', held) == 0 then
    redis.call('SREM', prefix .. @key_holding, pattern)
  end
end

-- The tasks an earlier version held in lists, up to `batch` of each pattern, are let out
-- oldest first, each given a place in that order: the next fetch holds them by rank.
local function let_out_unranked(batch)
  for _, pattern in ipairs(redis.call('SMEMBERS', prefix .. @key_holding_unranked)) do
    local list = prefix .. @key_held_unranked .. pattern
    local ids = redis.call('RPOP', list, batch) or {}
    if redis.call('EXISTS', list) == 0 then
      redis.call('SREM', prefix .. @key_holding_unranked, pattern)
    end
    if #ids > 0 then
      local first = redis.call('INCRBY', prefix .. @key_held_places, #ids) - #ids
      local out = 0
      for i = #ids, 1, -1 do  -- the newest first: each goes to the head, the oldest last
        if let_out(ids[i], int_text(first + i)) then
          out = out + 1
        end
      end
      wake(prefix .. @key_wake, out)
    end
  end
end

-- Held task `id` (held for `pattern`, `place` its hash's) leaves its hold for good:
-- cancelled or deleted.
local function drop_hold(id, pattern, place)
  local gone = place and
      redis.call('ZREM', prefix .. @key_held .. pattern, held_member(place, id)) or 0
  if gone == 0 then
    gone = redis.call('LREM', prefix .. @key_held_unranked .. pattern, 1, id)
  end
  if gone > 0 then
    redis.call('DECR', prefix .. @key_waiting)
  end
end

-- The keys of the tasks held back, the sorted sets then an earlier version's lists, each
-- in the order of their patterns (the same on every call, so that pages of them hold
-- still): they count as pending.
local function held_keys()
  local ranked, unranked = {}, {}
  for _, found in ipairs({{ranked, @key_holding, @key_held},
                          {unranked, @key_holding_unranked, @key_held_unranked}}) do
    local patterns = redis.call('SMEMBERS', prefix .. found[2])
    table.sort(patterns)
    for i, pattern in ipairs(patterns) do
      found[1][i] = prefix .. found[3] .. pattern
    end
  end
  return ranked, unranked
end

-- An attempt of task `id`, of type `task_type`, stops running: it gives back its route
-- slot (`slot`; '' when it held none), and for each route it is covered by that holds
-- tasks back, the best held may start again (its limit is checked anew when it does).
-- A slot "<route>\n<fairness key>" (dequeue.lua: limited) is the key's of a route with
-- limits per key: the attempt leaves the key's running set and the route's, and the best
-- task held for that key may start again.
local holding_patterns = nil
local function release_limits(id, task_type, slot)
  if slot ~= '' then
    local route = string.match(slot, '^(.-)\n')
    redis.call('SREM', prefix .. @key_running .. slot, id)
    if route then
      redis.call('SREM', prefix .. @key_running .. route, id)
    end
    redis.call('HDEL', task_key(id), 'slot')
  end
  if holding_patterns == nil then
    holding_patterns = redis.call('SMEMBERS', prefix .. @key_holding)
  end
  for _, pattern in ipairs(holding_patterns) do
    if covers(pattern, task_type) or pattern == slot then
      unhold(pattern)
    end
  end
end

-- Task `id`, enqueued at `now` (ms), waits behind the first of its ordering key. Its score
-- is `now`, or one more than the last one's when that is later (tasks enqueued in the same
-- millisecond, or by one call), so the set keeps the order they were enqueued in.
local function queue_behind(id, now)
  local waiting = prefix .. @key_ordering_waiting
  local last = redis.call('ZRANGE', waiting, -1, -1, 'WITHSCORES')[2]
  redis.call('ZADD', waiting, math.max(tonumber(now), (tonumber(last) or 0) + 1), id)
end

-- Task `id` ended for good (completed, dead, cancelled, deleted): the next task of its
-- ordering key (`key`; '' for none) becomes pending, or scheduled if it is not due yet.
local function release_successor(id, key, now)
  if key == '' or not key then
    return
  end
  local list = prefix .. @key_ordering .. key
  local was_first = redis.call('LINDEX', list, 0) == id
  if redis.call('LREM', list, 1, id) == 0 then
    return  -- it left its key's list when it ended before (a purge of finished tasks)
  end
  local next_id = redis.call('LINDEX', list, 0)
  if not (was_first and next_id) then
    if not was_first then
      redis.call('DECR', prefix .. @key_waiting)  -- it waited; it does not any more
      redis.call('ZREM', prefix .. @key_ordering_waiting, id)
    end
    return
  end
  redis.call('DECR', prefix .. @key_waiting)
  redis.call('ZREM', prefix .. @key_ordering_waiting, next_id)
  local next_key = task_key(next_id)
  local due = tonumber(redis.pcall('HGET', next_key, 'due')) or now  -- no hash: the dequeue
  -- sets it aside
  if due > now then
    redis.call('HSET', next_key, 'state', 'scheduled')
    redis.call('ZADD', prefix .. @key_scheduled, due, next_id)
  else
    push_pending(prefix .. @key_pending, next_id, true)
    wake(prefix .. @key_wake, 1)
  end
end

-- Cancellation: a task asked to stop ends in the queue's `cancelled` set. One running is
-- marked (`cancel` = 1) and its worker told on `cancel:<worker>`, which it blocks on; the
-- scripts that would give a marked attempt another run end it as cancelled instead.
local function cancel_requested(id)
  return redis.call('HGET', task_key(id), 'cancel') == '1'
end

-- Task `id`, no longer running or waiting anywhere, ends cancelled: clients waiting for it
-- are told, and the next task of its ordering key may run (its unique lock, if any, stays
-- until its unique_for ends).
local function end_cancelled(id, now)
  local key = task_key(id)
  redis.call('HSET', key, 'state', 'cancelled', 'done', now)
  redis.call('HDEL', key, 'cancel')
  redis.call('ZADD', prefix .. @key_cancelled, now, id)
  release_successor(id, redis.call('HGET', key, 'ordk') or '', now)
  notify_done(id, 'cancelled', 'cancelled')
end

-- Expiry (`expires=` at enqueue): a task not started by its hash's 'exp' (ms) never runs.
-- The script that finds it so ends it dead, as fail.lua ends a task, its error TaskExpired
-- (the words after the prefix: `why`), an earlier attempt's traceback left as it was: its
-- ordering key's turn passes on and its waiters (result(), a flow) are told. Returns the error.
local EXPIRED = '@EXPIRED_PREFIX'
local function expire(id, why, now)
  local key = task_key(id)
  local text = EXPIRED .. ' ' .. why
  redis.call('HSET', key, 'state', 'dead', 'done', now, 'error', text)
  redis.call('ZADD', prefix .. @key_dead, now, id)
  release_successor(id, redis.call('HGET', key, 'ordk'), now)
  notify_done(id, 'dead', text)
  return text
end
