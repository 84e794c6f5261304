-- Take back attempts whose lease expired or whose worker stopped heartbeating.
-- Each recovery bumps the fencing token, so the old attempt can no longer settle the task,
-- and counts against max_recoveries, so a task that kills its worker ends in dead.
-- KEYS: lease, pending, dead, wake
-- ARGV: now, max_recoveries, batch, then the ids of lost workers (none: expired leases only)
-- Returns {requeued, killed}.
local now = now_ms()
local max_recoveries = tonumber(ARGV[2])
local ids
if #ARGV > 3 then
  local lost = {}
  for i = 4, #ARGV do
    lost[ARGV[i]] = true
  end
  ids = {}
  for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    if lost[redis.call('HGET', task_key(id), 'wid')] then
      ids[#ids + 1] = id
    end
  end
else
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[3])
end
local requeued, killed = 0, 0
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local key = task_key(id)
  if redis.call('EXISTS', key) == 1 then
    redis.call('HINCRBY', key, 'fence', 1)
    redis.call('HDEL', key, 'wid')
    if redis.call('HINCRBY', key, 'recov', 1) > max_recoveries then
      local reason = 'lost its worker more than ' .. max_recoveries ..
          ' times (the task may be killing its worker)'
      redis.call('HSET', key, 'state', 'dead', 'error', reason, 'done', now)
      redis.call('ZADD', KEYS[3], now, id)
      notify_done(key, id, 'dead', reason)
      killed = killed + 1
    else
      redis.call('HSET', key, 'state', 'pending', 'due', now)
      redis.call('RPUSH', KEYS[2], id)
      requeued = requeued + 1
    end
  end
end
if requeued > 0 then
  wake(KEYS[4], requeued)
end
return {requeued, killed}
