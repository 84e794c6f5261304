-- Delete tasks with everything kept for them (data, progress): one task by id
-- in any state but running (obsq delete), or a batch of one state's tasks (obsq purge,
-- repeated by the caller until the state is empty).
-- A task held back by a route limit leaves its hold (purging pending takes the held tasks
-- too: they count as pending), and one with an ordering key lets the next of its key
-- run (a purge takes that one in a later step). A unique lock stays until its unique_for
-- ends, and a deleted task's id is not remembered: an operator's delete frees it.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns for an id: the state it was in, 'running' (refused) or '' (no such task).
local now = now_ms()
local sets = {pending = KEYS[@k_pending], scheduled = KEYS[@k_scheduled],
              retry = KEYS[@k_retry], dead = KEYS[@k_dead], completed = KEYS[@k_completed],
              cancelled = KEYS[@k_cancelled]}

local function forget(id)
  local key = task_key(id)
  local f = redis.call('HMGET', key, 'held', 'ordk', 'hc')
  if f[1] then
    drop_hold(id, f[1], f[3])
  end
  release_successor(id, f[2] or '', now)
  notify_done(id, 'dead', 'deleted by an operator')  -- clients waiting in result()
  redis.call('DEL', key, prefix .. @key_progress .. id)
end

if ARGV[@mode] == 'id' then
  local id = ARGV[@id]
  if redis.call('HEXISTS', KEYS[@k_active], id) == 1 then
    return 'running'
  end
  local f = redis.call('HMGET', task_key(id), 'state', 'pri', 'fk')
  local state = f[1]
  if not state then
    return ''
  end
  if state == 'pending' then
    drop_pending(KEYS[@k_pending], id, f[2], f[3])
  elseif state == 'aggregating' then
    leave_group(id)
  end
  for _, set in ipairs({KEYS[@k_scheduled], KEYS[@k_retry], KEYS[@k_dead], KEYS[@k_completed],
                        KEYS[@k_cancelled]}) do
    redis.call('ZREM', set, id)
  end
  forget(id)
  return state
end

local key = sets[ARGV[@mode]]
local batch = tonumber(ARGV[@batch])
local ids
-- pending and the lists of the other priorities, then the tasks held back by a route limit
-- (they count as pending): those of a sorted set taken out of it here, those of an earlier
-- version's list by forget()
local ranked, unranked = {}, {}
local levels = key == KEYS[@k_pending] and level_lists(key) or {}
if key == KEYS[@k_pending] then
  ranked, unranked = held_keys()
  ids = redis.call('RPOP', key, batch) or {}
  for _, level in ipairs(levels) do
    if #ids < batch then
      for _, id in ipairs(redis.call('RPOP', level, batch - #ids) or {}) do
        ids[#ids + 1] = id
      end
    end
  end
  -- the tasks waiting under fairness keys, key by key
  local keyed = 0
  while #ids < batch do
    local key = redis.call('ZRANGE', prefix .. @key_fair_waiting, 0, 0)[1]
    if not key then
      break
    end
    local got, emptied = pop_keyed(key, batch - #ids)
    for _, id in ipairs(got) do
      ids[#ids + 1] = id
    end
    keyed = keyed + #got
    if emptied then
      redis.call('LREM', prefix .. @key_fair_ring, 1, key)
    end
  end
  if keyed > 0 then
    redis.call('DECRBY', prefix .. @key_fair_count, keyed)
  end
  for _, held in ipairs(ranked) do
    if #ids < batch then
      local popped = redis.call('ZPOPMIN', held, batch - #ids)
      for i = 1, #popped, 2 do
        ids[#ids + 1] = held_id(popped[i])
        redis.call('DECR', prefix .. @key_waiting)
      end
    end
  end
  for _, held in ipairs(unranked) do
    if #ids < batch then
      for _, id in ipairs(redis.call('LRANGE', held, -(batch - #ids), -1)) do
        ids[#ids + 1] = id
      end
    end
  end
else
  ids = {}
  local popped = redis.call('ZPOPMIN', key, batch)
  for i = 1, #popped, 2 do
    ids[#ids + 1] = popped[i]
  end
end
for _, id in ipairs(ids) do
  forget(id)
end
local left
if key == KEYS[@k_pending] then
  left = redis.call('LLEN', key)
  for _, list in ipairs(levels) do
    left = left + redis.call('LLEN', list)
  end
  left = left + (tonumber(redis.call('GET', prefix .. @key_fair_count)) or 0)
  for _, held in ipairs(ranked) do
    left = left + redis.call('ZCARD', held)
  end
  for _, held in ipairs(unranked) do
    left = left + redis.call('LLEN', held)
  end
else
  left = redis.call('ZCARD', key)
end
return {[@r_deleted] = #ids, [@r_left] = left}
