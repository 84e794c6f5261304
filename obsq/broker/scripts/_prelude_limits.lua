-- Prepended after _prelude.lua: what route limits and ordering keys keep in a queue's slot.
--   running:<pattern>  set of the ids running under a route's concurrency limit
--   held:<pattern>     list of ids held back by a limit of that route (pushed left, popped
--                      right), and `holding`, the set of patterns with such a list
--   rate:<pattern>     the route's next free start time (ms), for its rate limit
--   ord:<key>          list of the ids sharing an ordering key, in enqueue order: only the
--                      first is ever pending, scheduled, running or retrying
--   ordwait            sorted set of the ids waiting behind the first of their key, in
--                      enqueue order (queue_behind): the pending pages list them
--   waiting            how many tasks of the queue are held or wait for their key (they
--                      count as pending)
-- The task hash keeps `held` (the pattern it is held for), `slot` (the pattern whose
-- running set holds it), `ordk` (its ordering key), `ow` (it waited for that key) and `hc`
-- (its hold is counted as a throttled start; cleared when it starts, so a task the forwarder
-- lets out to look again is not counted twice).

-- Whether route `pattern` (a type, a prefix ending in ':' or '.', or '*') covers a type.
local function covers(pattern, task_type)
  if pattern == '*' or pattern == task_type then
    return true
  end
  local last = string.sub(pattern, -1)
  return (last == ':' or last == '.') and string.sub(task_type, 1, #pattern) == pattern
end

-- Park task `id` until a task of `pattern` stops running (or the forwarder lets one out).
local function hold(id, pattern)
  redis.call('LPUSH', prefix .. @key_held .. pattern, id)
  redis.call('SADD', prefix .. @key_holding, pattern)
  redis.call('HSET', task_key(id), 'held', pattern, 'hc', '1')
  redis.call('INCR', prefix .. @key_waiting)
end

-- The task held longest for `pattern` goes back to the head of pending; one whose key holds
-- no hash is set aside instead (set_aside): its id and why are returned.
local function unhold(pattern)
  local held = prefix .. @key_held .. pattern
  local id = redis.call('RPOP', held)
  if not id then
    redis.call('SREM', prefix .. @key_holding, pattern)
    return
  end
  if redis.call('LLEN', held) == 0 then
    redis.call('SREM', prefix .. @key_holding, pattern)
  end
  redis.call('DECR', prefix .. @key_waiting)
  if type(redis.pcall('HDEL', task_key(id), 'held')) == 'table' then  -- an error
    return id, task_aside(id, @key_held .. pattern, now_ms())
  end
  push_pending(prefix .. @key_pending, id, true)
  wake(prefix .. @key_wake, 1)
end

-- The lists of the tasks held back, one per route pattern, in the order of the patterns
-- (the same on every call, so that pages of them hold still): they count as pending.
local function held_lists()
  local patterns = redis.call('SMEMBERS', prefix .. @key_holding)
  table.sort(patterns)
  local lists = {}
  for i, pattern in ipairs(patterns) do
    lists[i] = prefix .. @key_held .. pattern
  end
  return lists
end

-- An attempt of task `id`, of type `task_type`, stops running: it gives back its route
-- slot (`slot`; '' when it held none), and for each route it is covered by that holds
-- tasks back, the longest held may start again (its limit is checked anew when it does).
local holding_patterns = nil
local function release_limits(id, task_type, slot)
  if slot ~= '' then
    redis.call('SREM', prefix .. @key_running .. slot, id)
    redis.call('HDEL', task_key(id), 'slot')
  end
  if holding_patterns == nil then
    holding_patterns = redis.call('SMEMBERS', prefix .. @key_holding)
  end
  for _, pattern in ipairs(holding_patterns) do
    if covers(pattern, task_type) then
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
