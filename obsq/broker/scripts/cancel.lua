-- Cancel a task (mode 'task'): one waiting in any state ends cancelled at once; one
-- running is marked, and its worker told. Or end a running attempt its worker stopped
-- because it was cancelled (mode 'attempt').
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns for a task: the state it ended in or stays in ('cancelled', 'completed', 'dead',
-- or 'aggregating' for a grouped task whose batch is being aggregated), 'running' (the
-- worker was told), or '' (no such task); for an attempt: 1, or 0 when the
-- fencing token is stale.
local now = now_ms()
local id = ARGV[@id]
if ARGV[@mode] == 'attempt' then
  if not release_attempt(KEYS[@k_active], KEYS[@k_lease], id, ARGV[@fence], ARGV[@worker]) then
    return settled_by(id, ARGV[@fence]) and 1 or 0
  end
  release_limits(id, ARGV[@type], ARGV[@slot])
  redis.call('HSET', task_key(id), 'fin', ARGV[@fence])
  end_cancelled(id, now)
  return 1
end
local key = task_key(id)
local f = redis.call('HMGET', key, 'state', 'held', 'ordk', 'ow', 'batch', 'pri', 'hc', 'fk')
local state = f[1]
if not state then
  return ''
end
if state == 'completed' or state == 'dead' or state == 'cancelled' then
  return state
end
if state == 'aggregating' and f[5] then
  return state  -- in a claimed batch: its aggregator has it (a waiting one is cancelled)
end
local owner = redis.call('HGET', KEYS[@k_active], id)
if owner then
  redis.call('HSET', key, 'cancel', '1')
  local worker = string.match(owner, '^[^:]*:(.*)$')
  local inbox = prefix .. @key_cancels .. worker
  redis.call('RPUSH', inbox, id)
  redis.call('EXPIRE', inbox, 60)
  return 'running'
end
if state == 'aggregating' then
  leave_group(id)
elseif f[2] then  -- held back by a route limit
  drop_hold(id, f[2], f[7])
elseif f[3] and redis.call('LINDEX', prefix .. @key_ordering .. f[3], 0) ~= id then
  -- waiting behind its ordering key: end_cancelled takes it out of the key's list
else
  drop_pending(KEYS[@k_pending], id, f[6], f[8])
  redis.call('ZREM', KEYS[@k_scheduled], id)
  redis.call('ZREM', KEYS[@k_retry], id)
end
end_cancelled(id, now)
return 'cancelled'
