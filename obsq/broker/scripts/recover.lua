-- Take back attempts whose lease expired or whose worker stopped heartbeating. Removing
-- the attempt from the active hash voids its fencing token, so the old attempt can no
-- longer settle the task; each recovery counts against max_recoveries, so a task that
-- kills its worker every time ends in dead.
-- KEYS: lease, pending, dead, wake, active, watched
-- ARGV: now, max_recoveries, batch, then the ids of lost workers (none: expired leases only)
-- Returns {requeued, killed}.
local now = now_ms()
local max_recoveries = tonumber(ARGV[2])
local ids = {}
if #ARGV > 3 then
  local lost = {}
  for i = 4, #ARGV do
    lost[ARGV[i]] = true
  end
  local owners = redis.call('HGETALL', KEYS[5])
  for i = 1, #owners, 2 do
    if lost[string.match(owners[i + 1], '^[^:]*:(.*)$')] then
      ids[#ids + 1] = owners[i]
    end
  end
else
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[3])
end
local requeued, killed = 0, 0
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[5], id)
  local key = task_key(id)
  if redis.call('EXISTS', key) == 1 then
    if redis.call('HINCRBY', key, 'recov', 1) > max_recoveries then
      local reason = 'lost its worker more than ' .. max_recoveries ..
          ' times (the task may be killing its worker)'
      redis.call('HSET', key, 'state', 'dead', 'error', reason, 'done', now)
      redis.call('ZADD', KEYS[3], now, id)
      if redis.call('SISMEMBER', KEYS[6], id) == 1 then
        notify_done(id, 'dead', reason)
      end
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
